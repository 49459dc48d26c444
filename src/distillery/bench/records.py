"""bench.json records as text and Markdown tables (``distillery bench``); the record itself is read by
:mod:`distillery.run_record`."""

from __future__ import annotations

from typing import Any, Mapping

from distillery.errors import DistilleryError
from distillery.markdown import format_count
from distillery.run_record import format_hardware, setting_label, speedup_over, sweep_of  # noqa: F401 (bench's API)


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


def format_sweep(bench: Mapping[str, Any]) -> str:
    """Every setting of a bench record: its label, its table, and the models it left out and why."""
    parts = []
    for record in sweep_of(bench):
        table = format_bench_table(record).rstrip("\n") if record.get("models") else "No model was timed here."
        lines = [f"{setting_label(record)}:", "", table]
        lines += [f"- {name}: {why}" for name, why in (record.get("skipped") or {}).items()]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"
