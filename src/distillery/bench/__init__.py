"""Latency and throughput, side by side, with a hardware fingerprint.

Every model of one comparison is measured in the same process, on the same inputs, with the
same thread count, and *interleaved*: run r times every model once, in an order rotated each
run, so that a load spike or thermal drift on a shared machine lands on all models alike instead
of on whichever happened to be measured last. Speed-ups are only ever computed between models of
one such measurement.

``benchmark()`` returns the ``bench.json`` record (docs/architecture.md, the run folder contract)::

    {"hardware": {"cpu", "cores", "threads", "torch", "gpu", ...},
     "models": {name: {"params", "effective_params", "flops_per_token",
                       "latency_ms": {"batch", "seq", "median", "p90", "runs"},
                       "throughput": {"batch", "seq", "sentences_per_s"}}},
     "speedup": {"latency": teacher/student, "throughput": student/teacher},
     "speedups": {name: {"latency", "throughput"}},   # every model vs the reference
     "settings": {...},                               # how it was measured: device, dtype, threads, shapes, runs
     "noise": {"stable", "reasons", "rounds", ...},   # was the timing steady (bench/noise.py)
     "sweep": [record, ...]}                          # one record per setting measured; the first is the above

A *setting* is a device (``cpu``, ``cuda``), a precision (CUDA only: ``fp32``, ``fp16``, ``bf16``) and,
on the CPU, a torch thread count: one record per CPU thread count asked for, one per CUDA precision.
The top-level keys repeat the first record of ``sweep`` so that readers of one record (the report's
table, the model card, benchmarks/) keep working. Speed-ups compare models of one setting only.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import itertools
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from distillery.bench import noise
from distillery.data.encode import model_device, model_inputs
from distillery.errors import DistilleryError
from distillery.folders import write_file
from distillery.runtime import load_model
from distillery.bench.records import (format_bench_table, format_count, format_hardware, format_sweep,  # noqa: F401
                                     setting_label, speedup_over, sweep_of)
from distillery.bench.settings import DEVICES, DTYPES, bench_flags, measured_settings, usable_cpus  # noqa: F401

# Random ids start above the special and rare tokens of usual WordPiece/BPE vocabularies
# (BERT's [unused*] block ends at 998) so that every model sees ordinary word pieces.
FIRST_ORDINARY_ID = 1000


# --------------------------------------------------------------------------------------------
# What the numbers were measured on


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _physical_cores() -> int | None:
    """Distinct (socket, core) pairs in /proc/cpuinfo; None where that file says nothing."""
    try:
        pairs, socket = set(), "0"
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key == "physical id":
                    socket = value.strip()
                elif key == "core id":
                    pairs.add((socket, value.strip()))
        return len(pairs) or None
    except OSError:
        return None


def hardware_fingerprint(device: str | torch.device | None = None) -> dict[str, Any]:
    """What a measurement ran on: CPU model, cores, torch threads, torch version, GPU.

    ``cores`` is the number of physical cores where /proc/cpuinfo tells it, else
    ``os.cpu_count()``; ``usable_cpus`` is how many of them this process may run on (containers
    often get fewer). ``gpu`` is the name of the CUDA device measured on: the given ``device``
    when it is a CUDA device, None for a CPU device; with no device given, the current CUDA
    device when there is one.
    """
    usable = usable_cpus()
    gpu = None
    if device is None:
        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name()
    else:
        device = torch.device(device)
        if device.type == "cuda":
            gpu = torch.cuda.get_device_name(device)
    return {
        "cpu": _cpu_name(),
        "cores": _physical_cores() or os.cpu_count(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "gpu": gpu,
        "device": str(device) if device is not None else ("cuda" if gpu else "cpu"),
        "platform": platform.platform(),
    }


# --------------------------------------------------------------------------------------------
# Size and work


def _unique_parameters(model: nn.Module):
    """Each parameter tensor once, even when tied (same Parameter) or aliased (same storage)."""
    seen = set()
    for p in model.parameters():  # already drops repeated Parameter objects
        key = (p.data_ptr(), tuple(p.shape), p.stride()) if p.data_ptr() else id(p)
        if key in seen:
            continue
        seen.add(key)
        yield p


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """``(params, effective_params)`` of a model.

    ``params``: every parameter, a tied or shared tensor counted once.

    ``effective_params``: the parameters used to compute *one token's* output. A model that
    knows better says so with ``num_effective_parameters()`` (a mixture-of-experts student
    counts only the expert a token is routed to). Otherwise it is every parameter except the
    embedding tables, plus one row of each table (a token looks up one row: ``hidden`` numbers
    for BERT's word, position and token-type tables; ``d*d`` for a matrix embedding). A table
    whose tensor is also the weight of another layer (an LM head tied to the word embeddings)
    is used whole by that layer, so it counts whole.
    """
    if not isinstance(model, nn.Module):
        raise DistilleryError(f"Expected a torch model, got {type(model).__name__}.")
    params = sum(p.numel() for p in _unique_parameters(model))
    own = getattr(model, "num_effective_parameters", None)
    if callable(own):
        return params, int(own())

    lookup_only: dict[int, nn.Parameter] = {}
    used_densely: set[int] = set()
    for module in model.modules():
        for p in module._parameters.values():
            if p is None:
                continue
            if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
                lookup_only[id(p)] = p
            else:
                used_densely.add(id(p))
    effective = params
    for pid, table in lookup_only.items():
        if pid in used_densely:
            continue
        row = table.numel() // table.shape[0] if table.dim() else table.numel()
        effective -= table.numel() - row
    return params, int(effective)


def _vocab_size(model: nn.Module) -> int:
    config = getattr(model, "config", None)
    size = getattr(config, "vocab_size", None)
    if size:
        return int(size)
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            return int(module.num_embeddings)
    raise DistilleryError(
        f"Cannot tell the vocabulary size of {type(model).__name__}: it has no config.vocab_size "
        "and no embedding table."
    )


def make_inputs(model: nn.Module, batch: int, seq: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids (seeded, ordinary ids only), a full attention mask, and token-type zeros, as far
    as ``model.forward`` takes them (:func:`distillery.data.encode.model_inputs`); on the model's device."""
    vocab = _vocab_size(model)
    low = min(FIRST_ORDINARY_ID, vocab // 2)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(low, vocab, (batch, seq), generator=generator)
    return model_inputs({"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)},
                        model)


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _addmm_flops(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


def flops_per_token(model: nn.Module, seq: int = 128) -> float:
    """FLOPs of one forward at batch 1 x ``seq`` divided by ``seq``.

    Counted by ``torch.utils.flop_counter.FlopCounterMode`` on the operations actually executed
    (matrix products and attention), so a routed mixture of experts counts only the experts its
    tokens went to, and a lookup counts nothing. Attention grows with the sequence, so the figure
    is for that ``seq``. A multiply-add counts 2.
    """
    from torch.utils.flop_counter import FlopCounterMode

    if seq < 1:
        raise DistilleryError(f"seq must be a positive number of tokens, got {seq}.")
    # The CPU fused attention kernel is missing from torch's formula table; without this entry
    # attention would count as free on CPU (the CUDA kernels are in the table).
    # An in-place addmm_ (the MoE shared block accumulates onto the routed rows) is missing too.
    custom = {torch.ops.aten.addmm_: _addmm_flops}
    cpu_sdpa = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_sdpa is not None:
        custom[cpu_sdpa] = _cpu_sdpa_flops
    inputs = make_inputs(model, 1, seq)
    was_training = model.training
    model.eval()
    # Frozen while counting: the counter's module tracker hooks the gradient of every module input that
    # requires grad, and fails on a parameter passed as one (DeBERTa-v2's relative embeddings).
    requires = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in requires:
            p.requires_grad_(False)
        with torch.inference_mode(), FlopCounterMode(display=False, custom_mapping=custom) as counter:
            model(**inputs)
    finally:
        for p, flag in requires:
            p.requires_grad_(flag)
        model.train(was_training)
    return counter.get_total_flops() / seq


# --------------------------------------------------------------------------------------------
# Timing


def _check_shape(name: str, shape) -> tuple[int, int]:
    try:
        batch, seq = (int(x) for x in shape)
    except (TypeError, ValueError):
        raise DistilleryError(f"{name} must be (batch, seq), got {shape!r}.") from None
    if batch < 1 or seq < 1:
        raise DistilleryError(f"{name} must hold a positive batch and sequence length, got {shape!r}.")
    return batch, seq


def _check_positions(name: str, model: nn.Module, seq: int) -> None:
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(limit, int) and seq > limit:
        raise DistilleryError(
            f"Model {name!r} takes at most {limit} positions; a sequence of {seq} cannot be measured."
        )


class _WallClock:
    """CPU timing: the wall clock around each forward pass (a CPU forward returns when its work is done)."""

    def sync(self) -> None:
        pass

    def time(self, call) -> float:
        start = time.perf_counter()
        call()
        return time.perf_counter() - start


class _CudaEvents:
    """CUDA timing. Kernels run asynchronously: the wall clock around a call would time their launch,
    not their work. A pair of events recorded on the stream around the call, read once the end event
    has completed, times the work on the GPU itself."""

    def sync(self) -> None:
        torch.cuda.synchronize()

    def time(self, call) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0  # elapsed_time is in milliseconds


def _timer_for(models: Mapping[str, nn.Module]):
    return _CudaEvents() if any(model_device(m).type == "cuda" for m in models.values()) else _WallClock()


def _interleaved_times(
    models: Mapping[str, nn.Module], inputs: Mapping[str, dict], runs: int, warmup: int, timer=None
) -> dict[str, list[float]]:
    """Seconds per forward pass of each model, ``runs`` times, models taking turns (``timer``: how a pass
    is timed; by default CUDA events when a model is on a GPU, else the wall clock)."""
    names = list(models)
    if not names:  # a setting where no model runs (all CPU-only on a GPU)
        return {}
    timer = timer or _timer_for(models)
    for name in names:
        for _ in range(warmup):
            models[name](**inputs[name])
    timer.sync()  # the warm-up's queued kernels must not land in the first timed pass
    times = {name: [] for name in names}
    for r in range(runs):
        k = r % len(names)
        for name in names[k:] + names[:k]:  # rotated: no model is always first or last
            times[name].append(timer.time(lambda m=models[name], x=inputs[name]: m(**x)))
    return times


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """torch's intra-op thread count set to ``threads`` (None: left as it is) for the block, then restored."""
    previous = torch.get_num_threads()
    try:
        if threads is not None:
            torch.set_num_threads(int(threads))
        yield
    finally:
        torch.set_num_threads(previous)


def latency_ms(models: Mapping[str, nn.Module], shape: tuple[int, int] = (1, 128), runs: int = 20, warmup: int = 3,
               threads: int | None = None, seed: int = 0) -> dict[str, float]:
    """Median milliseconds per forward pass of each model at ``shape`` (batch, seq), the models taking
    turns in one process, where they are (the timing :func:`benchmark` uses, without its throughput pass and counts)."""
    batch, seq = _check_shape("shape", shape)
    with torch_threads(threads):
        times = _times_at({n: m.eval() for n, m in models.items()}, (batch, seq), int(runs), int(warmup), seed)
    return {n: float(statistics.median(t)) * 1000.0 for n, t in times.items()}


def checked_latency_ms(models: Mapping[str, nn.Module], shape: tuple[int, int] = (1, 128), runs: int = 20,
                       warmup: int = 3, threads: int | None = None, seed: int = 0) -> tuple[dict[str, float], dict]:
    """One round of :func:`latency_ms` (models interleaved, medians in ms) with its noise check
    (:func:`noise.noise_record`: each model's spread, the machine's load): the caller decides what to do
    when it says unstable (:func:`benchmark` times again, at most ``noise.ROUNDS`` rounds)."""
    batch, seq = _check_shape("shape", shape)
    with torch_threads(threads):
        load_start = noise.machine_load()
        times = _times_at({n: m.eval() for n, m in models.items()}, (batch, seq), int(runs), int(warmup), seed)
        checked = noise.noise_record(noise.spreads(times), 1, load_start, noise.machine_load(), usable_cpus())
    return {n: float(statistics.median(t)) * 1000.0 for n, t in times.items()}, checked


def check_settings(settings: Mapping[str, Any]) -> None:
    """Refuse bad :func:`benchmark` keyword settings (a run's ``bench:`` section) before any work."""
    known = [name for name in inspect.signature(benchmark).parameters if name != "models"]
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise DistilleryError(f"Unknown bench setting(s) {', '.join(unknown)}; known: {', '.join(known)}.")
    for name in ("latency_shape", "throughput_shape"):
        if name in settings:
            _check_shape(name, settings[name])
    whole = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    for name, low in (("latency_runs", 1), ("throughput_runs", 1), ("warmup", 0)):
        value = settings.get(name)
        if value is not None and (not whole(value) or value < low):
            raise DistilleryError(f"bench {name} must be a whole number of at least {low}, got {value!r}.")
    measured_settings(settings.get("device"), settings.get("dtype", "fp32"), settings.get("threads"))


# --------------------------------------------------------------------------------------------
# The measurement


def benchmark(
    models: Mapping[str, nn.Module | str | os.PathLike],
    *,
    latency_shape: tuple[int, int] = (1, 128),
    throughput_shape: tuple[int, int] = (256, 64),
    latency_runs: int = 30,
    warmup: int = 5,
    throughput_runs: int = 3,
    threads: int | Sequence[int] | None = None,
    device: str | Sequence[str] | None = None,
    dtype: str | Sequence[str] = "fp32",
    reference: str = "teacher",
    seed: int = 0,
) -> dict[str, Any]:
    """Measure several models side by side; return the ``bench.json`` record.

    ``models`` maps a name ("teacher", "student", any variant) to a model or a saved model
    folder. Latency is the median (and p90) of ``latency_runs`` forward passes at
    ``latency_shape`` after ``warmup`` passes; throughput is batch / median seconds of
    ``throughput_runs`` passes at ``throughput_shape`` after one warm-up pass. ``threads`` (one count
    or several), ``device`` and ``dtype`` choose the settings measured (:func:`measured_settings`); each
    gets its own record in ``sweep``, the first one's also at the top level. A model that runs on the
    CPU only (ONNX, int8) is left out of a CUDA setting, with a note under its ``skipped``.
    ``speedups`` compares every model with ``reference``; ``speedup`` is the one for "student".
    The given models are left where they are (a CUDA setting times copies).
    """
    if not isinstance(models, Mapping) or not models:
        raise DistilleryError("benchmark() needs a non-empty mapping of names to models.")
    check_settings({"latency_shape": latency_shape, "throughput_shape": throughput_shape, "latency_runs": latency_runs,
                    "warmup": warmup, "throughput_runs": throughput_runs, "threads": threads, "device": device,
                    "dtype": dtype})
    plan = {"latency_shape": _check_shape("latency_shape", latency_shape),
            "throughput_shape": _check_shape("throughput_shape", throughput_shape),
            "latency_runs": int(latency_runs), "warmup": int(warmup), "throughput_runs": int(throughput_runs),
            "reference": reference, "seed": int(seed)}
    loaded = _loaded_models(models, max(plan["latency_shape"][1], plan["throughput_shape"][1]))
    modes = {name: m.training for name, m in loaded.items()}
    try:
        for m in loaded.values():
            m.eval()
        sizes = {name: _size_record(m, plan["latency_shape"][1], plan["throughput_shape"][1])
                 for name, m in loaded.items()}
        sweep = [_measure_setting(loaded, sizes, setting, plan)
                 for setting in measured_settings(device, dtype, threads)]
    finally:
        for name, m in loaded.items():
            m.train(modes[name])
    if not sweep[0]["models"]:
        raise DistilleryError(f"No model given runs on {setting_label(sweep[0])}: "
                              + " ".join(f"{n}: {why}" for n, why in sweep[0].get("skipped", {}).items()))
    return {**sweep[0], "sweep": sweep}


def _measure_setting(loaded: Mapping[str, nn.Module], sizes: Mapping[str, dict], setting: Mapping[str, Any],
                     plan: Mapping[str, Any]) -> dict[str, Any]:
    """One setting's record: every model that runs there timed at both shapes, models taking turns."""
    target, dtype = torch.device(setting["device"]), DTYPES[setting["dtype"]]
    skipped = {name: why for name, m in loaded.items() if target.type != "cpu" and (why := _cpu_only(m))}
    placed: dict[str, nn.Module] = {}
    with torch_threads(setting["threads"]):
        try:
            placed = {n: _placed(m, target, dtype) for n, m in loaded.items() if n not in skipped}
            if dtype != torch.float32:
                skipped.update(_failing_at(placed, setting))
                placed = {n: m for n, m in placed.items() if n not in skipped}
            hardware = hardware_fingerprint(target)
            timer = _CudaEvents() if target.type == "cuda" else _WallClock()
            load_start = noise.machine_load()
            lat, spread, rounds = _steadiest_latency(placed, plan, timer)
            tp = _times_at(placed, plan["throughput_shape"], plan["throughput_runs"], 1, plan["seed"], timer)
            checked = noise.noise_record(spread, rounds, load_start, noise.machine_load(), hardware["usable_cpus"])
        finally:
            placed.clear()  # the copies on the GPU go now, not when the next setting is measured
            if target.type == "cuda":
                torch.cuda.empty_cache()
    records = {name: _timed_record(sizes[name], lat[name], tp[name], plan) for name in lat}
    reference = plan["reference"]
    speedups = {name: speedup_over(records[reference], rec) for name, rec in records.items()
                if reference in records and name != reference}
    speedup = dict(speedups["student"]) if reference == "teacher" and "student" in speedups else {}
    settings = {"device": setting["device"], "dtype": setting["dtype"], "threads": hardware["threads"],
                "reference": reference, "latency_shape": list(plan["latency_shape"]),
                "throughput_shape": list(plan["throughput_shape"]), "latency_runs": plan["latency_runs"],
                "warmup": plan["warmup"], "throughput_runs": plan["throughput_runs"], "throughput_warmup": 1,
                "seed": plan["seed"], "order": "interleaved, rotated each run",
                "timer": "CUDA events" if target.type == "cuda" else "wall clock"}
    record = {"hardware": hardware, "models": records, "speedup": speedup, "speedups": speedups, "settings": settings,
              "noise": checked}
    if skipped:
        record["skipped"] = skipped
    return record


def _steadiest_latency(models: Mapping[str, nn.Module], plan: Mapping[str, Any], timer):
    """The latency passes of every model, timed again while a model's spread is above the limit (at most
    ``noise.ROUNDS`` rounds): the round whose worst spread is smallest, its spreads and the rounds timed."""
    best, rounds = None, 0
    for rounds in range(1, noise.ROUNDS + 1):
        times = _times_at(models, plan["latency_shape"], plan["latency_runs"], plan["warmup"], plan["seed"], timer)
        spread = noise.spreads(times)
        worst = max(spread.values(), default=0.0)
        if best is None or worst < best[2]:
            best = (times, spread, worst)
        if worst <= noise.MAX_SPREAD:
            break
    return best[0], best[1], rounds


def _cpu_only(model: nn.Module) -> str | None:
    """Why ``model`` cannot be timed on a GPU (an ONNX Runtime graph, torch's dynamic int8), or None."""
    exported = getattr(model, "exported_architecture", None)
    quantized = any(type(m).__module__.startswith(("torch.ao.nn.quantized", "torch.nn.quantized"))
                    for m in model.modules())
    if exported is None and not quantized:
        return None
    backend = exported.backend if exported is not None else "torch int8"
    return f"Runs on the CPU only ({backend}): not timed on a GPU."


def _placed(model: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """``model`` on ``device`` at ``dtype``: itself when it is there already, else a copy, so that the
    caller's model (and its fp32 weights) stays as it was."""
    floats = [p.dtype for p in itertools.chain(model.parameters(), model.buffers()) if p.is_floating_point()]
    if model_device(model).type == device.type and (floats[0] if floats else torch.float32) == dtype:
        return model
    return copy.deepcopy(model).to(device=device, dtype=dtype)


def _failing_at(models: Mapping[str, nn.Module], setting: Mapping[str, Any]) -> dict[str, str]:
    """The models that fail one forward pass at a reduced precision (an op without an fp16 kernel), with
    why: they are left out of that setting, not allowed to end a run whose fp32 figures stand."""
    failing = {}
    with torch.inference_mode():
        for name, model in models.items():
            try:
                model(**make_inputs(model, 1, 8))
            except (RuntimeError, TypeError, ValueError) as e:
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                failing[name] = f"Does not run on {setting['device']} at {setting['dtype']}: {first}"
    return failing


def _timed_record(size: Mapping[str, Any], lat: Sequence[float], tp: Sequence[float],
                  plan: Mapping[str, Any]) -> dict[str, Any]:
    """A model's ``bench.json`` record: its sizes, then its latency and throughput (``lat``, ``tp``: seconds)."""
    (lat_batch, lat_seq), (tp_batch, tp_seq) = plan["latency_shape"], plan["throughput_shape"]
    ms = [t * 1000.0 for t in lat]
    return {**size,
            "latency_ms": {"batch": lat_batch, "seq": lat_seq, "median": float(statistics.median(ms)),
                           "p90": float(np.percentile(ms, 90)), "runs": plan["latency_runs"]},
            "throughput": {"batch": tp_batch, "seq": tp_seq,
                           "sentences_per_s": float(tp_batch / statistics.median(tp))}}


def _on_one_device(models: Mapping[str, nn.Module]) -> dict[str, nn.Module]:
    """The models to time together, on one device: where some are on the CPU (a model built for timing, an ONNX
    export) and others on a GPU (a teacher trained there), the GPU ones are timed as CPU copies. CUDA events, the
    timer when any model is on a GPU, do not see CPU work: every CPU model would look free."""
    if len({model_device(m).type for m in models.values()}) < 2:
        return dict(models)
    return {n: m if model_device(m).type == "cpu" else copy.deepcopy(m).cpu() for n, m in models.items()}


def _times_at(models: Mapping[str, nn.Module], shape: tuple[int, int], runs: int, warmup: int,
              seed: int, timer=None) -> dict[str, list[float]]:
    """:func:`_interleaved_times` on seeded random inputs of ``shape`` (batch, seq), freed afterwards, the models on
    one device (:func:`_on_one_device`)."""
    models = _on_one_device(models)
    with torch.inference_mode():
        inputs = {n: make_inputs(m, *shape, seed) for n, m in models.items()}
        return _interleaved_times(models, inputs, runs, warmup, timer)


def _loaded_models(models: Mapping[str, nn.Module | str | os.PathLike], seq: int) -> dict[str, nn.Module]:
    """Each model by name, a folder loaded; refused when it is no torch model or takes fewer than ``seq`` positions."""
    loaded: dict[str, nn.Module] = {}
    for name, model in models.items():
        if isinstance(model, (str, os.PathLike)):
            model = load_model(model)
        if not isinstance(model, nn.Module):
            raise DistilleryError(f"Model {name!r} is a {type(model).__name__}, not a torch model or a folder.")
        _check_positions(name, model, seq)
        loaded[str(name)] = model
    return loaded


def _size_record(model: nn.Module, lat_seq: int, tp_seq: int) -> dict[str, Any]:
    """A model's parameter and FLOP counts, the start of its ``bench.json`` record.

    An exported model (ONNX graph, packed int8 weights) has no parameters to count or torch ops to
    trace; its figures are those of the fp32 architecture it carries, beside its backend."""
    exported = getattr(model, "exported_architecture", None)
    counted = exported.fp32_model() if exported is not None else model
    params, effective = count_parameters(counted)
    record: dict[str, Any] = {"params": params, "effective_params": effective,
                              "flops_per_token": float(flops_per_token(counted, seq=lat_seq))}
    if exported is not None:
        record["backend"] = exported.backend
        if exported.weights_bytes:
            record["weights_bytes"] = exported.weights_bytes
    # attention grows with the sequence: the throughput shape has its own count
    record["flops_per_token_throughput"] = float(flops_per_token(counted, seq=tp_seq))
    return record


def save_bench(bench: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write a bench record as indented JSON; return the path."""
    return write_file(path, json.dumps(bench, indent=2) + "\n")
