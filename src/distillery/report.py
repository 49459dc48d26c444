"""A run folder -> ``report.md`` + ``plot.png`` (main metric against latency).

A run folder holds ``config.yaml``, ``metrics.json`` and ``bench.json`` (docs/architecture.md), and maybe
``train.json`` (training times and notes), read as records by :mod:`distillery.run_record`. The report puts every model of the run in one table
(teacher, student, any other variant measured), states the verdict the numbers support, and places
the student beside the free baselines measured live in the same run (the teacher's int8 copy, static
embeddings distilled from it), naming what to deploy. ``merge_runs`` does the same across the run
folders of several methods on one task.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from distillery.config import setting
from distillery.errors import DistilleryError
from distillery.folders import atomic_file, claim_for_rewrite
from distillery.markdown import fmt_metric, fmt_ms, fmt_pct, fmt_x, format_count, md
from distillery.metrics import is_finite_number
from distillery.plot import dominates, plot_points, write_plot
from distillery.report_parts import (baseline_section, below_static_warning, config_lines, fact_text, rows_table, shape_text,
                                     verdict_paragraphs)
from distillery.run_record import BASELINE_NAMES, Bench, Metrics, Run, load_run, run_rows, student_name, teacher_name

def deployment_section(rows: Sequence[Mapping[str, Any]], main: str) -> str:
    """Where the run measured exported variants (``teacher-int8``, ...): does a student variant beat
    each variant of the teacher on both speed and score? Empty when there are none."""
    teachers = [r for r in rows if r["model"].startswith("teacher-")]
    students = [r for r in rows if r["model"] == "student" or r["model"].startswith("student-")]
    if not teachers:
        return ""
    lines = ["## Deployment variants", "",
             "Exported and quantized models (`distillery export`), scored on the same dev set and measured in "
             "the same process as the teacher. Parity, quantization settings and the quality drop of each "
             "export are in its folder's `distillery_export.json`.", ""]
    for t in teachers:
        winners = [s for s in students if dominates(s, t)]
        desc = f"{md(t['model'], code=True)} ({md(main)} {fmt_metric(t['main'])}, {fmt_x(t['latency_speedup'])} the teacher's speed)"
        if winners:
            best = max(winners, key=lambda r: (r["main"], -r["latency_ms"]))
            others = ", ".join(md(w["model"], code=True) for w in winners if w is not best)
            lines.append(f"- {desc} is dominated by {md(best['model'], code=True)} ({fmt_metric(best['main'])}, "
                         f"{fmt_x(best['latency_speedup'])}): as fast or faster and as good or better"
                         + (f"; also by {others}" if others else "") + ".")
        else:
            fastest = min((s for s in students if s["latency_ms"]), key=lambda r: r["latency_ms"], default=None)
            extra = ""
            if fastest is not None and fastest["main"] is not None and t["main"] is not None:
                extra = (f" (the fastest, {md(fastest['model'], code=True)}, scores {fmt_metric(fastest['main'])} at "
                         f"{fmt_x(fastest['latency_speedup'])})")
            lines.append(f"- {desc} is not dominated by any student variant{extra}.")
    return "\n".join(lines) + "\n"




# --------------------------------------------------------------------------------------------
# Reports


def _chain_role(i: int, last: int) -> str:
    if i == 0:
        return "original teacher"
    return "this run's student" if i == last else f"student {i}" + (" (the direct teacher)" if i == last - 1 else "")


def chain_section(metrics: Metrics, main: str) -> str:
    """The models this run's student descends from, when its teacher was an earlier run's student
    (metrics.json "chain"): each with its score and the final student's retention against it. The direct
    teacher's score is this run's measurement; the earlier ones are their runs' (on the same task only)."""
    chain = metrics.chain_links()
    if chain is None or len(chain) < 3:
        return ""
    last, task = len(chain) - 1, metrics.task
    final = (metrics.student or {}).get(main)
    steps = [md(chain[0]["model"], code=True)] + [f"{md(link['method'], code=True)} student" for link in chain[1:]]
    lines = ["## Chain", "", "This student descends from " + " → ".join(steps) + ".", "",
             f"| model | made by | {md(main)} | final student's retention |", "|---|---|---|---|"]
    for i, link in enumerate(chain):
        scores = metrics.teacher if i == last - 1 else metrics.student if i == last else link["metrics"]
        score = (scores or {}).get(main) if link["task"] in (None, task) else None
        kept = final / score if is_finite_number(final) and is_finite_number(score) and score else None
        lines.append(f"| {_chain_role(i, last)}: {md(link['model'], code=True)} | "
                     f"{md(link['method'] or '—')} | {fmt_metric(score)} | {fmt_pct(kept)} |")
    return "\n".join(lines + [""])


def speed_by_setting(bench: Bench) -> list[str]:
    """The report's lines on the speed-ups of the student and the live baselines in every setting measured
    (device, threads, precision), each against the teacher timed in the same setting; none for a bench of
    one setting."""
    sweep = bench.sweep()
    if len(sweep) < 2:
        return []
    names = [n for n in ("student", *BASELINE_NAMES) if any(n in r.models or n in r.skipped for r in sweep)]
    lines = ["## Speed by setting", "",
             f"The table above is the first setting, {md(sweep[0].label())}. Each cell: latency / "
             "throughput speed-up over the teacher timed in the same setting (speed-ups depend on the hardware).", "",
             "| setting | teacher latency (ms) | " + " | ".join(md(n) for n in names) + " |",
             "|---|---|" + "---|" * len(names)]
    notes: dict[str, str] = {}
    for record in sweep:
        cells = []
        for name in names:
            if name in record.skipped:
                notes.setdefault(name, str(record.skipped[name]))
                cells.append("not timed")
            elif record.speedup(name):
                s = record.speedup(name)
                cells.append(f"{fmt_x(s['latency'])} / {fmt_x(s['throughput'])}")
            else:
                cells.append("—")
        lines.append(f"| {md(record.label())} | {fmt_ms(record.latency_ms('teacher'))} | " + " | ".join(cells) + " |")
    left_out = [f"- Not timed: {md(name)}: {md(why)}" for name, why in notes.items()]
    return lines + [""] + (left_out + [""] if left_out else [])


def write_report(run_dir: str | os.PathLike) -> Path:
    """Write ``report.md`` and ``plot.png`` into a run folder; return the report's path."""
    run = load_run(run_dir)
    config, metrics, bench = run.config, run.metrics, run.bench
    main = metrics.main()
    task = run.task()
    method = setting(config, "method", "distillation")
    rows = run_rows(run)
    lat_shape = shape_text(rows, "latency_shape", "1×128")
    tp_shape = shape_text(rows, "throughput_shape", "256×64")
    by_name = {r["model"]: r for r in rows}
    teacher = teacher_name(config)

    out = [f"# {md(method)} on {md(task)}", ""]
    at_chance = metrics.chance_warning()
    if at_chance:
        out += [f"**{md(at_chance)}**", ""]
    below_static = below_static_warning(metrics)
    if below_static:
        out += [f"**{md(below_static)}**", ""]
    compressed = f"Teacher {md(teacher, code=True)} compressed with {md(method, code=True)}" + (
        f" into the pretrained student {md(student_name(config), code=True)}" if student_name(config) else "")
    t, s = by_name.get("teacher"), by_name.get("student")
    if t and s and t["params"] and s["params"]:
        compressed += (
            f": {format_count(t['params'])} → {format_count(s['params'])} parameters, "
            f"{format_count(t['effective_params'])} → {format_count(s['effective_params'])} used per token"
        )
    out += [compressed + ".", ""]
    cfg_lines = config_lines(config, run.train, metrics)
    if cfg_lines:
        out += cfg_lines + [""]
    out += ["## Verdict", ""] + verdict_paragraphs(run, rows, main, lat_shape, tp_shape, chance_line=False)
    chain = chain_section(metrics, main)
    if chain:
        out += [chain]
    split = metrics.split
    out += [
        "## Results",
        "",
        f"Scores on the {md(task)} {md(split or 'evaluation')} split; speed measured side by side in one process "
        f"(latency: median of single forwards at {lat_shape}; throughput at {tp_shape}). "
        "Speed-ups and retention are against the teacher.",
        "",
        rows_table(rows, main),
    ]
    hardware = bench.hardware_line()
    if hardware:
        out += [f"Hardware: {md(hardware)}.", ""]
    flops = [(r["model"], r["flops_per_token"]) for r in rows if r["flops_per_token"]]
    if flops:
        out += ["FLOPs per token: " + ", ".join(f"{md(n)} {f / 1e6:.3g} M" for n, f in flops) + ".", ""]
    out += speed_by_setting(bench)
    deployment = deployment_section(rows, main)
    if deployment:
        out += [deployment]
    if metrics.baselines or metrics.baseline_notes:
        out += [baseline_section(bench, metrics, metrics.baseline_notes or ())]

    folder = run.dir
    points = plot_points(rows)
    if points:
        write_plot(points, folder / "plot.png", main, title=f"{method} on {task}: {main} vs latency at {lat_shape}")
        out += ["![score against latency](plot.png)", ""]
    return _write_markdown(folder / "report.md", out)


def _write_markdown(path: Path, lines: Sequence[str]) -> Path:
    with atomic_file(path, "w") as f:  # a reader never finds half a report
        f.write("\n".join(lines).rstrip() + "\n")
    return path


def _run_line(label: str, run: Run) -> str:
    """A merged report's line on one of its runs: method, budget, teacher, the titled fields of its metrics.json
    (:meth:`Metrics.facts`), hardware."""
    cfg = run.config
    line = (f"- {md(label, code=True)}: method {md(setting(cfg, 'method', '?'), code=True)}, "
            f"budget {md(setting(cfg, 'budget', '?'), code=True)}, teacher {md(teacher_name(cfg), code=True)}")
    line += "".join(f"; {md(title)}: {fact_text(value)}" for title, value in run.metrics.facts())
    hardware = run.bench.hardware_line()
    return line + (f"; measured on {md(hardware)}" if hardware else "")


def merge_runs(run_dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike) -> Path:
    """One table and one plot across the run folders of several methods on the same task.

    Each run's speed-ups stay against its own teacher, measured in its own process; latencies of
    different runs are only comparable when the runs shared a machine (the hardware lines say).
    Writes ``report.md`` and ``plot.png`` into ``out_dir``, a folder it creates and marks, or one it
    made before (see :func:`distillery.folders.claim_for_rewrite`: a folder distillery did not write,
    a run folder or one holding the runs is refused); returns the report's path.
    """
    if not run_dirs:
        raise DistilleryError("Give at least one run folder to merge.")
    seen: dict[Path, str] = {}
    for given in map(str, run_dirs):  # one run twice would be two rows of one measurement, compared with itself
        real = Path(given).expanduser().resolve()
        if real in seen:
            twice = f"{given} is given twice" if seen[real] == given else f"{seen[real]} and {given} are one run folder ({real})"
            raise DistilleryError(f"{twice}; give each run once.")
        seen[real] = given
    runs = [load_run(d) for d in run_dirs]
    tasks = {r.task() for r in runs}
    if len(tasks) > 1:
        raise DistilleryError(f"These runs are on different tasks ({', '.join(sorted(tasks))}); merge runs of one task.")
    task = tasks.pop()
    mains = {r.metrics.main() for r in runs}
    if len(mains) > 1:
        raise DistilleryError(f"These runs report different main metrics ({', '.join(sorted(mains))}).")
    main = mains.pop()

    labels, rows = [], []
    for i, run in enumerate(runs):
        label = run.dir.name or f"run{i}"
        if label in labels:
            label = f"{label}#{i}"
        labels.append(label)
        for row in run_rows(run):
            row["run"] = label
            teacherish = row["model"] == "teacher" or row["model"].startswith("teacher-")
            row["point"] = f"{row['model']} ({label})" if teacherish else f"{setting(run.config, 'method', label)}:{row['model']}"
            rows.append(row)

    out_dir = claim_for_rewrite(out_dir, "report", inputs=run_dirs)
    lat_shape = shape_text(rows, "latency_shape", "1×128")
    lines = [f"# Methods compared on {md(task)}", ""]
    lines += [_run_line(label, run) for label, run in zip(labels, runs)]
    lines += ["", "Speed-ups and retention are against each run's own teacher.", "", rows_table(rows, main, with_run=True)]
    best = [r for r in rows if r["model"] != "teacher" and r["main"] is not None and r["latency_speedup"]]
    if best:
        top = max(best, key=lambda r: r["main"])
        fastest = max(best, key=lambda r: r["latency_speedup"])
        lines += [
            f"Most accurate compressed model: {md(top['point'], code=True)} ({md(main)} {fmt_metric(top['main'])}, "
            f"{fmt_x(top['latency_speedup'], 1)} at {lat_shape}). Fastest: {md(fastest['point'], code=True)} "
            f"({fmt_x(fastest['latency_speedup'], 1)}, {md(main)} {fmt_metric(fastest['main'])}).",
            "",
        ]
    points = plot_points(rows, label_key="point")
    if points:
        write_plot(points, out_dir / "plot.png", main, title=f"{task}: {main} vs latency at {lat_shape}")
        lines += ["![score against latency](plot.png)", ""]
    return _write_markdown(out_dir / "report.md", lines)


