"""A run folder -> ``report.md`` + ``plot.png`` (main metric against latency).

A run folder holds ``config.yaml``, ``metrics.json`` and ``bench.json`` (docs/architecture.md), and maybe
``train.json`` (training times and notes). The report puts every model of the run in one table
(teacher, student, any other variant measured), states the verdict the numbers support, and places
the student beside the free baselines measured live in the same run (the teacher's int8 copy, static
embeddings distilled from it), naming what to deploy. ``merge_runs`` does the same across the run
folders of several methods on one task.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from distillery.bench import format_count, format_hardware, setting_label, speedup_over, sweep_of
from distillery.config import load_yaml, setting, yaml_problem
from distillery.errors import DistilleryError
from distillery.folders import atomic_file, claim_for_rewrite
from distillery.bench.noise import noise_warning
from distillery.live_baselines import BASELINE_NAMES, baseline_section, deploy_sentence
from distillery.markdown import fmt_metric, fmt_ms, fmt_pct, fmt_rate, fmt_seconds, fmt_x, md
from distillery.metrics import chance_warning, is_finite_number
from distillery.plot import dominates, plot_points, write_plot
from distillery.run_files import SHAPES, check_shape

REQUIRED_FILES = ("config.yaml", "metrics.json", "bench.json")
OPTIONAL_FILES = ("train.json",)

# --------------------------------------------------------------------------------------------
# Reading a run folder


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DistilleryError(f"{path} is not valid JSON: {e}") from None


def load_run(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The files of a run folder as ``{"dir", "config", "metrics", "bench", "train"}``."""
    folder = Path(run_dir).expanduser()
    if not folder.is_dir():
        raise DistilleryError(f"Run folder {run_dir} does not exist.")
    for name in REQUIRED_FILES:
        if not (folder / name).is_file():
            raise DistilleryError(f"Run folder {folder} has no {name}; a report needs {', '.join(REQUIRED_FILES)}.")
    try:
        config = load_yaml((folder / "config.yaml").read_text()) or {}
    except yaml.YAMLError as e:
        raise DistilleryError(f"{folder / 'config.yaml'} is not valid YAML: {yaml_problem(e)}.") from None
    if not isinstance(config, dict):
        raise DistilleryError(f"{folder / 'config.yaml'} must hold a mapping of settings.")
    metrics = _read_json(folder / "metrics.json")
    bench = _read_json(folder / "bench.json")
    if not isinstance(metrics, dict) or not isinstance(metrics.get("teacher"), dict):
        raise DistilleryError(f"{folder / 'metrics.json'} must hold the teacher's metrics under \"teacher\".")
    if not isinstance(bench, dict) or not isinstance(bench.get("models"), dict) or not bench["models"]:
        raise DistilleryError(f"{folder / 'bench.json'} must hold the measured models under \"models\".")
    train = _read_json(folder / "train.json") if (folder / "train.json").is_file() else {}
    for name, value in (("metrics.json", metrics), ("bench.json", bench), ("train.json", train or {})):
        check_shape(folder / name, value, SHAPES[name])
    return {"dir": folder, "config": config, "metrics": metrics, "bench": bench, "train": train or {}}


def teacher_name(config: Mapping[str, Any]) -> str:
    teacher = config.get("teacher")
    if isinstance(teacher, Mapping):
        return str(teacher.get("name") or "teacher")
    return str(teacher) if teacher else "teacher"


def student_name(config: Mapping[str, Any]) -> str | None:
    """The pretrained encoder a run distilled into (method distill's ``--student``), as given; None when the
    student was made from the teacher itself."""
    student = setting(config, "method_options.student")
    return str(student) if student else None


def task_name(run: Mapping[str, Any]) -> str:
    return str(run["metrics"].get("task") or setting(run["config"], "data.task") or setting(run["config"], "task") or "?")


def main_metric(metrics: Mapping[str, Any]) -> str:
    main = metrics.get("main_metric")
    if main:
        return str(main)
    numeric = [k for k, v in metrics["teacher"].items() if is_finite_number(v)]
    return numeric[0] if numeric else "score"


def model_metrics(metrics: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Every model's numeric metrics: teacher, student, the entries under "others" (export variants), then the
    live baselines."""
    out: dict[str, dict[str, float]] = {}
    sources = [("teacher", metrics.get("teacher")), ("student", metrics.get("student"))]
    sources += list((metrics.get("others") or {}).items())
    sources += list((metrics.get("baselines") or {}).items())
    for name, values in sources:
        if isinstance(values, Mapping):
            out[str(name)] = {k: float(v) for k, v in values.items() if is_finite_number(v)}
    return out


def run_rows(run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per model of a run (measured, scored or both), teacher first.

    Speed-ups are against the run's own teacher (measured in the same process); retention is the
    model's main metric over the teacher's.
    """
    metrics = run["metrics"]
    main = main_metric(metrics)
    scores = model_metrics(metrics)
    measured = run["bench"]["models"]
    names = list(dict.fromkeys(["teacher"] + list(scores) + list(measured)))
    names = [n for n in names if n in scores or n in measured]
    teacher_bench = measured.get("teacher")
    teacher_main = scores.get("teacher", {}).get(main)
    rows = []
    for name in names:
        rec = measured.get(name) or {}
        values = scores.get(name, {})
        latency = setting(rec, "latency_ms.median")
        throughput = setting(rec, "throughput.sentences_per_s")
        speedup: dict[str, float] = {}
        if teacher_bench is not None and latency and throughput:
            speedup = speedup_over(teacher_bench, rec)
        score = values.get(main)
        retention = None
        if name == "student" and is_finite_number(metrics.get("retention")):
            retention = float(metrics["retention"])
        elif score is not None and teacher_main:
            retention = score / teacher_main
        rows.append(
            {
                "model": name,
                "params": rec.get("params"),
                "effective_params": rec.get("effective_params"),
                "flops_per_token": rec.get("flops_per_token"),
                "latency_ms": latency,
                "latency_shape": (setting(rec, "latency_ms.batch"), setting(rec, "latency_ms.seq")),
                "throughput": throughput,
                "throughput_shape": (setting(rec, "throughput.batch"), setting(rec, "throughput.seq")),
                "latency_speedup": speedup.get("latency"),
                "throughput_speedup": speedup.get("throughput"),
                "flop_ideal_latency": speedup.get("flop_ideal_latency"),
                "flop_ideal_throughput": speedup.get("flop_ideal_throughput"),
                "metrics": values,
                "main": score,
                "retention": retention,
            }
        )
    return rows


# --------------------------------------------------------------------------------------------
# Formatting

def shape_text(rows: Sequence[Mapping[str, Any]], key: str, default: str) -> str:
    for row in rows:
        batch, seq = row[key]
        if batch and seq:
            return f"{md(batch)}×{md(seq)}"
    return default


def rows_table(rows: Sequence[Mapping[str, Any]], main: str, *, with_run: bool = False) -> str:
    """Markdown table: sizes, speed, speed-ups, main metric first then the other metrics, retention."""
    others = []
    for row in rows:
        for k in row["metrics"]:
            if k != main and k not in others:
                others.append(k)
    lat_shape = shape_text(rows, "latency_shape", "1×128")
    tp_shape = shape_text(rows, "throughput_shape", "256×64")
    head = (["run"] if with_run else []) + [
        "model",
        "params",
        "effective params",
        f"latency {lat_shape} median (ms)",
        f"throughput {tp_shape} (sent/s)",
        "latency speed-up (FLOP-ideal)",
        "throughput speed-up (FLOP-ideal)",
        md(main),
        *map(md, others),
        f"retention ({md(main)})",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = ([md(row.get("run", ""))] if with_run else []) + [
            md(row["model"]),
            format_count(row["params"]) if row["params"] is not None else "—",
            format_count(row["effective_params"]) if row["effective_params"] is not None else "—",
            fmt_ms(row["latency_ms"]),
            fmt_rate(row["throughput"]),
            _with_ideal(row["latency_speedup"], row.get("flop_ideal_latency")),
            _with_ideal(row["throughput_speedup"], row.get("flop_ideal_throughput")),
            fmt_metric(row["main"]),
            *[fmt_metric(row["metrics"].get(k)) for k in others],
            fmt_pct(row["retention"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _with_ideal(measured: float | None, ideal: float | None) -> str:
    """A measured speed-up with the FLOP-ideal one for the same shape beside it: ``1.64× (1.87×)``."""
    return fmt_x(measured) + (f" ({fmt_x(ideal)})" if ideal else "")


def _faster(x: float) -> str:
    return f"{x:.1f}× faster" if x >= 1 else f"{1 / x:.1f}× slower"


def verdict(rows: Sequence[Mapping[str, Any]], main: str, lat_shape: str = "1×128", tp_shape: str = "256×64",
            at_chance: bool = False) -> str:
    """A few sentences stating what the numbers say about the student against the teacher (``at_chance``:
    the teacher learned nothing, so the student's share of its score is not given)."""
    by_name = {r["model"]: r for r in rows}
    student, teacher = by_name.get("student"), by_name.get("teacher")
    if student is None or teacher is None:
        return "There is no teacher/student pair in this run to compare."
    parts = []
    if student["latency_speedup"] is not None:
        s = f"The student is {_faster(student['latency_speedup'])} than the teacher at {lat_shape}"
        if student["throughput_speedup"] is not None:
            s += f" ({student['throughput_speedup']:.1f}× the teacher's throughput at {tp_shape})"
        parts.append(s)
    else:
        parts.append("The student was not measured for speed")
    if at_chance:
        parts.append(f"scores {fmt_metric(student['main'])} ({md(main)}; the teacher {fmt_metric(teacher['main'])}, "
                     "at chance)")
    elif student["retention"] is not None:
        parts.append(
            f"keeps {100 * student['retention']:.1f} % of the teacher's {md(main)} "
            f"({fmt_metric(student['main'])} against {fmt_metric(teacher['main'])})"
        )
    text = " and ".join(parts) + "."
    if teacher["params"] and student["params"]:
        text += f" It has {_ratio_words(teacher['params'], student['params'], 'parameters')}"
        if teacher["effective_params"] and student["effective_params"]:
            text += f" ({_ratio_words(teacher['effective_params'], student['effective_params'], 'used per token')})"
        text += "."
    return text


def verdict_paragraphs(run: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], main: str, lat_shape: str,
                       tp_shape: str, *, chance_line: bool = True) -> list[str]:
    """The verdict the report and the model card share, as paragraphs (each followed by a blank line): the
    student against the teacher, a teacher at chance (``chance_line``: the report says it first instead),
    unstable timings, and what to deploy."""
    at_chance, unstable = chance_warning(run["metrics"]), noise_warning(run["bench"])
    deploy = deploy_sentence(run["bench"], run["metrics"])
    return [verdict(rows, main, lat_shape, tp_shape, at_chance=bool(at_chance)), "",
            *([f"**{md(at_chance)}**", ""] if at_chance and chance_line else []),
            *([f"**{md(unstable)}**", ""] if unstable else []), *([deploy, ""] if deploy else [])]


def _ratio_words(teacher: float, student: float, what: str) -> str:
    """'2.0× fewer parameters' or, for a student with more (CMOW's embedding tables), '1.6× more parameters'."""
    if student <= teacher:
        return f"{teacher / student:.1f}× fewer {what}"
    return f"{student / teacher:.1f}× more {what}"


def config_lines(
    config: Mapping[str, Any], train: Mapping[str, Any], metrics: Mapping[str, Any] | None = None
) -> list[str]:
    lines = []
    if config.get("teacher"):
        finetuned = setting(config, "teacher.finetuned")
        lines.append(f"- teacher: {md(teacher_name(config), code=True)}" + (" (given fine-tuned)" if finetuned else ""))
    if student_name(config):
        lines.append(f"- student: the pretrained encoder {md(student_name(config), code=True)}, distilled from the teacher")
    for label, key in (("method", "method"), ("budget", "budget"), ("task", "data.task")):
        value = setting(config, key)
        if value is not None:
            lines.append(f"- {label}: {md(value, code=True)}")
    options = setting(config, "method_options")
    if isinstance(options, Mapping) and options:
        lines.append("- method options: " + ", ".join(md(f"{k}={v}", code=True) for k, v in options.items()))
    if setting(config, "student.select_best", False):
        lines.append("- the student's weights are those of its best evaluation on this same dev split "
                     "(as GLUE papers select), so its dev score is slightly optimistic")
    used = [train.get(k) for k in ("teacher_train_examples", "train_examples")]
    for key, what in (("train_limit", "training examples"), ("dev_limit", "dev examples")):
        value = setting(config, f"data.{key}") or (metrics or {}).get(key)
        # a train limit the split never reached, or that only the teacher kept to (the student had them all),
        # limited nothing the scores rest on
        if key == "train_limit" and is_finite_number(value) and all(map(is_finite_number, used)) \
                and (used[0] < value or used[1] > value):
            continue
        if value:
            lines.append(f"- limited to {md(value)} {what} (`{key}`): scores are noisier than on the full set")
    if is_finite_number(train.get("train_examples")):
        teacher_n = train.get("teacher_train_examples")
        lines.append(f"- training examples: {int(train['train_examples']):,}"
                     + (f" (the teacher fine-tuned on {int(teacher_n):,} of them, and labelled the rest)"
                        if is_finite_number(teacher_n) and teacher_n < train["train_examples"] else ""))
    lines += student_text_lines(train.get("student_text"))
    if train.get("teacher_cached") and not setting(config, "teacher.finetuned"):  # a given one is not fine-tuned here
        lines.append("- teacher fine-tuning reused from the cache")
    for key, value in train.items():
        if key.endswith("_seconds") and is_finite_number(value):
            what = key[: -len("_seconds")].replace("_", " ")
            label = "whole run time" if what == "total" else f"{what} training time"
            lines.append(f"- {md(label)}: {fmt_seconds(value)}")
    notes = train.get("notes")
    if isinstance(notes, str):
        notes = [notes]
    for note in notes or []:
        lines.append(f"- note: {md(note)}")
    return lines


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


def chain_section(metrics: Mapping[str, Any], main: str) -> str:
    """The models this run's student descends from, when its teacher was an earlier run's student
    (metrics.json "chain"): each with its score and the final student's retention against it. The direct
    teacher's score is this run's measurement; the earlier ones are their runs' (on the same task only)."""
    chain = metrics.get("chain")
    if not isinstance(chain, list) or len(chain) < 3 or not all(isinstance(link, Mapping) for link in chain):
        return ""
    last, task = len(chain) - 1, metrics.get("task")
    final = (metrics.get("student") or {}).get(main)
    steps = [md(chain[0].get("model"), code=True)] + [f"{md(link.get('method'), code=True)} student"
                                                      for link in chain[1:]]
    lines = ["## Chain", "", "This student descends from " + " → ".join(steps) + ".", "",
             f"| model | made by | {md(main)} | final student's retention |", "|---|---|---|---|"]
    for i, link in enumerate(chain):
        scores = metrics.get("teacher") if i == last - 1 else metrics.get("student") if i == last else link.get("metrics")
        score = (scores or {}).get(main) if link.get("task") in (None, task) else None
        kept = final / score if is_finite_number(final) and is_finite_number(score) and score else None
        lines.append(f"| {_chain_role(i, last)}: {md(link.get('model'), code=True)} | "
                     f"{md(link.get('method') or '—')} | {fmt_metric(score)} | {fmt_pct(kept)} |")
    return "\n".join(lines + [""])


def speed_by_setting(bench: Mapping[str, Any]) -> list[str]:
    """The report's lines on the speed-ups of the student and the live baselines in every setting measured
    (device, threads, precision), each against the teacher timed in the same setting; none for a bench of
    one setting."""
    sweep = sweep_of(bench)
    if len(sweep) < 2:
        return []
    names = [n for n in ("student", *BASELINE_NAMES)
             if any(n in (r.get("models") or {}) or n in (r.get("skipped") or {}) for r in sweep)]
    lines = ["## Speed by setting", "",
             f"The table above is the first setting, {md(setting_label(sweep[0]))}. Each cell: latency / "
             "throughput speed-up over the teacher timed in the same setting (speed-ups depend on the hardware).", "",
             "| setting | teacher latency (ms) | " + " | ".join(md(n) for n in names) + " |",
             "|---|---|" + "---|" * len(names)]
    notes: dict[str, str] = {}
    for record in sweep:
        models, skipped = record.get("models") or {}, record.get("skipped") or {}
        teacher = models.get("teacher")
        cells = []
        for name in names:
            if name in skipped:
                notes.setdefault(name, str(skipped[name]))
                cells.append("not timed")
            elif teacher is not None and name in models:
                s = speedup_over(teacher, models[name])
                cells.append(f"{fmt_x(s['latency'])} / {fmt_x(s['throughput'])}")
            else:
                cells.append("—")
        latency = setting(teacher or {}, "latency_ms.median")
        lines.append(f"| {md(setting_label(record))} | {fmt_ms(latency)} | " + " | ".join(cells) + " |")
    left_out = [f"- Not timed: {md(name)}: {md(why)}" for name, why in notes.items()]
    return lines + [""] + (left_out + [""] if left_out else [])


def write_report(run_dir: str | os.PathLike) -> Path:
    """Write ``report.md`` and ``plot.png`` into a run folder; return the report's path."""
    run = load_run(run_dir)
    config, metrics, bench = run["config"], run["metrics"], run["bench"]
    main = main_metric(metrics)
    task = task_name(run)
    method = setting(config, "method", "distillation")
    rows = run_rows(run)
    lat_shape = shape_text(rows, "latency_shape", "1×128")
    tp_shape = shape_text(rows, "throughput_shape", "256×64")
    by_name = {r["model"]: r for r in rows}
    teacher = teacher_name(config)

    out = [f"# {md(method)} on {md(task)}", ""]
    at_chance = chance_warning(metrics)
    if at_chance:
        out += [f"**{md(at_chance)}**", ""]
    compressed = f"Teacher {md(teacher, code=True)} compressed with {md(method, code=True)}" + (
        f" into the pretrained student {md(student_name(config), code=True)}" if student_name(config) else "")
    t, s = by_name.get("teacher"), by_name.get("student")
    if t and s and t["params"] and s["params"]:
        compressed += (
            f": {format_count(t['params'])} → {format_count(s['params'])} parameters, "
            f"{format_count(t['effective_params'])} → {format_count(s['effective_params'])} used per token"
        )
    out += [compressed + ".", ""]
    cfg_lines = config_lines(config, run["train"], metrics)
    if cfg_lines:
        out += cfg_lines + [""]
    out += ["## Verdict", ""] + verdict_paragraphs(run, rows, main, lat_shape, tp_shape, chance_line=False)
    chain = chain_section(metrics, main)
    if chain:
        out += [chain]
    split = metrics.get("split")
    out += [
        "## Results",
        "",
        f"Scores on the {md(task)} {md(split or 'evaluation')} split; speed measured side by side in one process "
        f"(latency: median of single forwards at {lat_shape}; throughput at {tp_shape}). "
        "Speed-ups and retention are against the teacher.",
        "",
        rows_table(rows, main),
    ]
    hardware = bench.get("hardware") or {}
    if hardware:
        out += [f"Hardware: {md(format_hardware(hardware))}.", ""]
    flops = [(r["model"], r["flops_per_token"]) for r in rows if r["flops_per_token"]]
    if flops:
        out += ["FLOPs per token: " + ", ".join(f"{md(n)} {f / 1e6:.3g} M" for n, f in flops) + ".", ""]
    out += speed_by_setting(bench)
    deployment = deployment_section(rows, main)
    if deployment:
        out += [deployment]
    if metrics.get("baselines") or metrics.get("baseline_notes"):
        out += [baseline_section(bench, metrics, metrics.get("baseline_notes") or ())]

    folder = run["dir"]
    points = plot_points(rows)
    if points:
        write_plot(points, folder / "plot.png", main, title=f"{method} on {task}: {main} vs latency at {lat_shape}")
        out += ["![score against latency](plot.png)", ""]
    return _write_markdown(folder / "report.md", out)


def _write_markdown(path: Path, lines: Sequence[str]) -> Path:
    with atomic_file(path, "w") as f:  # a reader never finds half a report
        f.write("\n".join(lines).rstrip() + "\n")
    return path


def _run_line(label: str, run: Mapping[str, Any]) -> str:
    """A merged report's line on one of its runs: method, budget, teacher, hardware."""
    cfg = run["config"]
    line = (f"- {md(label, code=True)}: method {md(setting(cfg, 'method', '?'), code=True)}, "
            f"budget {md(setting(cfg, 'budget', '?'), code=True)}, teacher {md(teacher_name(cfg), code=True)}")
    hardware = run["bench"].get("hardware")
    return line + (f"; measured on {md(format_hardware(hardware))}" if hardware else "")


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
    runs = [load_run(d) for d in run_dirs]
    tasks = {task_name(r) for r in runs}
    if len(tasks) > 1:
        raise DistilleryError(f"These runs are on different tasks ({', '.join(sorted(tasks))}); merge runs of one task.")
    task = tasks.pop()
    mains = {main_metric(r["metrics"]) for r in runs}
    if len(mains) > 1:
        raise DistilleryError(f"These runs report different main metrics ({', '.join(sorted(mains))}).")
    main = mains.pop()

    labels, rows = [], []
    for i, run in enumerate(runs):
        label = run["dir"].name or f"run{i}"
        if label in labels:
            label = f"{label}#{i}"
        labels.append(label)
        for row in run_rows(run):
            row["run"] = label
            teacherish = row["model"] == "teacher" or row["model"].startswith("teacher-")
            row["point"] = f"{row['model']} ({label})" if teacherish else f"{setting(run['config'], 'method', label)}:{row['model']}"
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


def student_text_lines(text: Any) -> list[str]:
    """What the student's text held (train.json's ``student_text``): labelled, augmented and unlabeled rows,
    the augmentation source and the time the teacher spent labelling them; none for a run without new rows."""
    if not isinstance(text, Mapping) or not any(is_finite_number(text.get(k)) and text[k] for k in ("augmented", "unlabeled")):
        return []
    counts = [f"{int(text[k]):,} {k}" for k in ("labelled", "augmented", "unlabeled") if is_finite_number(text.get(k))]
    source = text.get("augment_source")
    line = "- the student's text: " + ", ".join(counts) + (f" (augmented from {md(source)})" if source else "")
    seconds = text.get("labelling_seconds")
    if is_finite_number(seconds):
        line += "; the teacher labelled them in " + (fmt_seconds(seconds) if seconds else "no time (its logits were cached)")
    return [line]
