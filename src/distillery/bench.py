"""Latency and throughput, side by side, with a hardware fingerprint.

Every model of one comparison is measured in the same process, on the same inputs, with the
same thread count, and *interleaved*: run r times every model once, in an order rotated each
run, so that a load spike or thermal drift on a shared machine lands on all models alike instead
of on whichever happened to be measured last. Speed-ups are only ever computed between models of
one such measurement.

``benchmark()`` returns the ``bench.json`` record of DESIGN.md::

    {"hardware": {"cpu", "cores", "threads", "torch", "gpu", ...},
     "models": {name: {"params", "effective_params", "flops_per_token",
                       "latency_ms": {"batch", "seq", "median", "p90", "runs"},
                       "throughput": {"batch", "seq", "sentences_per_s"}}},
     "speedup": {"latency": teacher/student, "throughput": student/teacher},
     "speedups": {name: {"latency", "throughput"}},   # every model vs the reference
     "settings": {...}}                               # how it was measured
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from distillery.data.encode import model_inputs
from distillery.errors import DistilleryError
from distillery.runtime import load_model

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
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
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


def _model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return torch.device("cpu")


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


def _interleaved_times(
    models: Mapping[str, nn.Module], inputs: Mapping[str, dict], runs: int, warmup: int
) -> dict[str, list[float]]:
    """Seconds per forward pass of each model, ``runs`` times, models taking turns."""
    names = list(models)
    cuda = any(_model_device(m).type == "cuda" for m in models.values())

    def sync():
        if cuda:
            torch.cuda.synchronize()

    for name in names:
        for _ in range(warmup):
            models[name](**inputs[name])
    sync()
    times = {name: [] for name in names}
    for r in range(runs):
        k = r % len(names)
        for name in names[k:] + names[:k]:  # rotated: no model is always first or last
            sync()
            start = time.perf_counter()
            models[name](**inputs[name])
            sync()
            times[name].append(time.perf_counter() - start)
    return times


@contextlib.contextmanager
def _torch_threads(threads: int | None):
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
    turns in one process (the timing :func:`benchmark` uses, without its throughput pass and counts)."""
    batch, seq = _check_shape("shape", shape)
    with _torch_threads(threads):
        times = _times_at({n: m.eval() for n, m in models.items()}, (batch, seq), int(runs), int(warmup), seed)
    return {n: float(statistics.median(t)) * 1000.0 for n, t in times.items()}


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
    for name, low in (("latency_runs", 1), ("throughput_runs", 1), ("warmup", 0), ("threads", 1)):
        value = settings.get(name)
        if value is not None and (not whole(value) or value < low):
            raise DistilleryError(f"bench {name} must be a whole number of at least {low}, got {value!r}.")


def benchmark(
    models: Mapping[str, nn.Module | str | os.PathLike],
    *,
    latency_shape: tuple[int, int] = (1, 128),
    throughput_shape: tuple[int, int] = (256, 64),
    latency_runs: int = 30,
    warmup: int = 5,
    throughput_runs: int = 3,
    threads: int | None = None,
    reference: str = "teacher",
    seed: int = 0,
) -> dict[str, Any]:
    """Measure several models side by side; return the ``bench.json`` record.

    ``models`` maps a name ("teacher", "student", any variant) to a model or a saved model
    folder. Latency is the median (and p90) of ``latency_runs`` forward passes at
    ``latency_shape`` after ``warmup`` passes; throughput is batch / median seconds of
    ``throughput_runs`` passes at ``throughput_shape`` after one warm-up pass. ``threads`` fixes
    torch's intra-op thread count for the measurement (the count is recorded either way).
    ``speedups`` compares every model with ``reference``; ``speedup`` is the one for "student".
    """
    if not isinstance(models, Mapping) or not models:
        raise DistilleryError("benchmark() needs a non-empty mapping of names to models.")
    check_settings({"latency_shape": latency_shape, "throughput_shape": throughput_shape, "latency_runs": latency_runs,
                    "warmup": warmup, "throughput_runs": throughput_runs, "threads": threads})
    lat_batch, lat_seq = _check_shape("latency_shape", latency_shape)
    tp_batch, tp_seq = _check_shape("throughput_shape", throughput_shape)
    loaded = _loaded_models(models, max(lat_seq, tp_seq))

    modes = {name: m.training for name, m in loaded.items()}
    try:
        with _torch_threads(threads):
            for m in loaded.values():
                m.eval()
            devices = {_model_device(m) for m in loaded.values()}
            hardware = hardware_fingerprint(next(iter(devices)) if len(devices) == 1 else None)
            records = {name: _size_record(m, lat_seq, tp_seq) for name, m in loaded.items()}
            lat = _times_at(loaded, (lat_batch, lat_seq), int(latency_runs), int(warmup), seed)
            tp = _times_at(loaded, (tp_batch, tp_seq), int(throughput_runs), 1, seed)
    finally:
        for name, m in loaded.items():
            m.train(modes[name])

    for name, record in records.items():
        ms = [t * 1000.0 for t in lat[name]]
        record["latency_ms"] = {"batch": lat_batch, "seq": lat_seq, "median": float(statistics.median(ms)),
                                "p90": float(np.percentile(ms, 90)), "runs": int(latency_runs)}
        record["throughput"] = {"batch": tp_batch, "seq": tp_seq,
                                "sentences_per_s": float(tp_batch / statistics.median(tp[name]))}

    speedups = {name: speedup_over(records[reference], rec) for name, rec in records.items()
                if reference in records and name != reference}
    speedup = dict(speedups["student"]) if reference == "teacher" and "student" in speedups else {}
    settings = {"reference": reference, "latency_runs": int(latency_runs), "warmup": int(warmup),
                "throughput_runs": int(throughput_runs), "throughput_warmup": 1, "seed": int(seed),
                "order": "interleaved, rotated each run"}
    return {"hardware": hardware, "models": records, "speedup": speedup, "speedups": speedups, "settings": settings}


def _times_at(models: Mapping[str, nn.Module], shape: tuple[int, int], runs: int, warmup: int,
              seed: int) -> dict[str, list[float]]:
    """:func:`_interleaved_times` on seeded random inputs of ``shape`` (batch, seq), freed afterwards."""
    with torch.inference_mode():
        inputs = {n: make_inputs(m, *shape, seed) for n, m in models.items()}
        return _interleaved_times(models, inputs, runs, warmup)


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


def speedup_over(ref: Mapping[str, Any], rec: Mapping[str, Any]) -> dict[str, float]:
    """How many times faster ``rec`` is than ``ref``: latency ref/rec, throughput rec/ref; and the
    FLOP-ideal ratios for the same shapes (ref FLOPs / rec FLOPs: what a speed-up would be if time
    followed FLOPs)."""
    out = {
        "latency": ref["latency_ms"]["median"] / rec["latency_ms"]["median"],
        "throughput": rec["throughput"]["sentences_per_s"] / ref["throughput"]["sentences_per_s"],
    }
    for key, field in (("flop_ideal_latency", "flops_per_token"), ("flop_ideal_throughput", "flops_per_token_throughput")):
        a, b = ref.get(field), rec.get(field)
        if a and b:
            out[key] = a / b
    return out


def save_bench(bench: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write a bench record as indented JSON; return the path."""
    path = Path(path)
    path.write_text(json.dumps(bench, indent=2) + "\n")
    return path


# --------------------------------------------------------------------------------------------
# Presentation


def format_count(n: float | int | None) -> str:
    """22.7M, 1.5k, 812."""
    if n is None:
        return "—"
    n = float(n)
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= size:
            return f"{n / size:.1f}{suffix}"
    return f"{n:.0f}"


def _gflops(flops: float | None) -> str:
    return "—" if flops is None else f"{flops / 1e9:.3g}"


def format_bench_table(bench: Mapping[str, Any]) -> str:
    """A markdown table of a bench record: one row per model, speed-ups vs the reference."""
    models = bench.get("models") or {}
    if not models:
        raise DistilleryError("The bench record holds no models.")
    reference = (bench.get("settings") or {}).get("reference", "teacher")
    ref = models.get(reference)
    first = next(iter(models.values()))
    lat, tp = first.get("latency_ms", {}), first.get("throughput", {})
    lat_shape = f"{lat.get('batch', '?')}×{lat.get('seq', '?')}"
    tp_shape = f"{tp.get('batch', '?')}×{tp.get('seq', '?')}"
    header = (
        f"| model | params | effective params | GFLOPs/token | latency {lat_shape} median (ms) | "
        f"p90 (ms) | throughput {tp_shape} (sent/s) | latency speed-up (FLOP-ideal) | throughput speed-up (FLOP-ideal) |"
    )
    lines = [header, "|" + "---|" * 9]
    for name, rec in models.items():
        if ref is not None:
            s = speedup_over(ref, rec)
            ideal = lambda key: f" ({s[key]:.2f}×)" if key in s else ""  # noqa: E731
            speed = (f"{s['latency']:.2f}×" + ideal("flop_ideal_latency"),
                     f"{s['throughput']:.2f}×" + ideal("flop_ideal_throughput"))
        else:
            speed = ("—", "—")
        lines.append(
            f"| {name} | {format_count(rec.get('params'))} | {format_count(rec.get('effective_params'))} | "
            f"{_gflops(rec.get('flops_per_token'))} | "
            f"{rec['latency_ms']['median']:.2f} | {rec['latency_ms']['p90']:.2f} | "
            f"{rec['throughput']['sentences_per_s']:.1f} | {speed[0]} | {speed[1]} |"
        )
    return "\n".join(lines) + "\n"


def format_hardware(hardware: Mapping[str, Any]) -> str:
    """One line: CPU, cores, threads, GPU, torch, platform."""
    gpu = hardware.get("gpu")
    parts = [
        f"CPU {hardware.get('cpu', 'unknown')}",
        f"{hardware.get('cores', '?')} cores",
        f"{hardware.get('threads', '?')} torch threads",
        f"GPU {gpu}" if gpu else "no GPU",
        f"torch {hardware.get('torch', '?')}",
    ]
    if hardware.get("platform"):
        parts.append(str(hardware["platform"]))
    return ", ".join(parts)
