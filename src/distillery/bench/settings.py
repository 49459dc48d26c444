"""Which settings one benchmark measures: devices (cpu, cuda), CUDA precisions and CPU thread counts,
from a run's ``bench:`` section or the CLI's ``--bench-device``, ``--dtype`` and ``--threads``; refused with
a sentence where this machine cannot measure them."""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from distillery.errors import DistilleryError

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DEVICES = ("cpu", "cuda")


def _listed(value: Any) -> list:
    """A setting given once, as a list (YAML) or as comma text (the CLI): its items."""
    if value is None:
        return []
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return list(value) if isinstance(value, (list, tuple)) else [value]


def usable_cpus() -> int:
    """How many CPUs this process may run on (a container's or taskset's share, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def _thread_counts(threads: Any) -> list[int | None]:
    counts: list[int | None] = []
    for item in _listed(threads):
        if isinstance(item, str) and item.isdigit():
            item = int(item)
        if not isinstance(item, int) or isinstance(item, bool) or item < 1:
            raise DistilleryError(f"bench threads must be whole numbers of at least 1 (one, or a comma list such "
                                  f"as 1,4), got {threads!r}.")
        if item > usable_cpus():  # threads beyond the cores time their contention, not the model
            raise DistilleryError(f"bench threads {item} is more than the {usable_cpus()} CPUs this process may use; "
                                  f"give at most {usable_cpus()}.")
        if item not in counts:
            counts.append(item)
    return counts or [None]


def _choices(value: Any, name: str, known: Sequence[str]) -> list[str]:
    items = list(dict.fromkeys(str(v).lower() for v in _listed(value)))
    unknown = [v for v in items if v not in known]
    if unknown:
        raise DistilleryError(f"Unknown bench {name} {unknown[0]!r}; choose {', '.join(known)} (or a comma list).")
    return items


def measured_settings(device: Any = None, dtype: Any = "fp32", threads: Any = None) -> list[dict[str, Any]]:
    """The settings one benchmark measures, in order: ``{"device", "dtype", "threads"}``, one per CPU thread
    count (``threads``; None: torch's count as it is) and one per CUDA precision (``dtype``). ``device``: cpu,
    cuda or both (a list or comma text); None times the CPU, and CUDA too where torch sees a GPU. The CPU
    is always timed in fp32. Refused with a sentence: fp16/bf16 with no CUDA to time, cuda with no GPU,
    thread counts with no CPU to time."""
    has_gpu = torch.cuda.is_available()
    devices = _choices(device, "device", DEVICES) or (["cpu", "cuda"] if has_gpu else ["cpu"])
    dtypes = _choices(dtype, "dtype", tuple(DTYPES)) or ["fp32"]
    counts = _thread_counts(threads)
    if "cuda" in devices and not has_gpu:
        raise DistilleryError("--bench-device cuda needs a CUDA GPU, and torch sees none on this machine "
                              "(torch.cuda.is_available() is False); time the CPU with --bench-device cpu.")
    half = [d for d in dtypes if d != "fp32"]
    if half and "cuda" not in devices:
        why = "" if device is not None else ", and torch sees no GPU on this machine"
        raise DistilleryError(f"--dtype {half[0]} applies on CUDA only (the CPU is timed in fp32){why}; "
                              "leave --dtype out or time a GPU with --bench-device cuda.")
    if counts != [None] and "cpu" not in devices:
        raise DistilleryError("--threads sets CPU thread counts, and only CUDA is timed (--bench-device cuda); "
                              "add the CPU (--bench-device cpu,cuda) or leave --threads out.")
    settings = []
    for dev in devices:
        if dev == "cpu":
            settings += [{"device": "cpu", "dtype": "fp32", "threads": n} for n in counts]
        else:
            settings += [{"device": "cuda", "dtype": d, "threads": None} for d in dtypes]
    return settings


def bench_flags(device: str | None = None, dtype: str | None = None, threads: str | None = None) -> dict[str, Any]:
    """The CLI's ``--bench-device``, ``--dtype`` and ``--threads`` (comma lists) as :func:`benchmark` keywords,
    the given ones only: one item stays one value (config.yaml reads ``threads: 4``), several make a list."""
    out: dict[str, Any] = {}
    for key, text in (("device", device), ("dtype", dtype), ("threads", threads)):
        items = _listed(text)
        if key == "threads":
            bad = [v for v in items if not v.isdigit()]
            if bad:
                raise DistilleryError(f"--threads takes whole numbers separated by commas (such as 1,4), got {text!r}.")
            items = [int(v) for v in items]
        if items:
            out[key] = items[0] if len(items) == 1 else items
    return out
