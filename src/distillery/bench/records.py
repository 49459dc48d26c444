"""bench.json records read back: the speed-ups between two models of one record, each setting's record
(``sweep``) and its label, and their presentation as text and Markdown tables."""

from __future__ import annotations

from typing import Any, Mapping

from distillery.errors import DistilleryError


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
    """One line: the GPU timed (when one was), CPU, cores, threads, torch, platform."""
    gpu = hardware.get("gpu")
    # "no GPU" would be wrong for a CPU setting timed on a machine that has one: a fingerprint names
    # the GPU only when the GPU was what was timed.
    parts = [f"GPU {gpu}"] if gpu else []
    parts += [
        f"CPU {hardware.get('cpu', 'unknown')}",
        f"{hardware.get('cores', '?')} cores",
        f"{hardware.get('threads', '?')} torch threads",
        f"torch {hardware.get('torch', '?')}",
    ]
    if hardware.get("platform"):
        parts.append(str(hardware["platform"]))
    return ", ".join(parts)


def setting_label(record: Mapping[str, Any]) -> str:
    """A bench record's setting in words: "CPU, 4 threads", "CUDA fp16 (NVIDIA H100 80GB HBM3)"."""
    settings, hardware = record.get("settings") or {}, record.get("hardware") or {}
    device = settings.get("device") or hardware.get("device") or "cpu"
    if str(device).startswith("cuda"):
        gpu = hardware.get("gpu")
        return f"CUDA {settings.get('dtype', 'fp32')}" + (f" ({gpu})" if gpu else "")
    threads = settings.get("threads", hardware.get("threads"))
    return "CPU" + (f", {threads} thread{'s' if threads != 1 else ''}" if threads else "")


def sweep_of(bench: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every setting's record of a bench record: its ``sweep``, or the record itself (one written before sweeps)."""
    sweep = bench.get("sweep")
    return [r for r in sweep if isinstance(r, Mapping)] if isinstance(sweep, list) and sweep else [bench]


def format_sweep(bench: Mapping[str, Any]) -> str:
    """Every setting of a bench record: its label, its table, and the models it left out and why."""
    parts = []
    for record in sweep_of(bench):
        table = format_bench_table(record).rstrip("\n") if record.get("models") else "No model was timed here."
        lines = [f"{setting_label(record)}:", "", table]
        lines += [f"- {name}: {why}" for name, why in (record.get("skipped") or {}).items()]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"
