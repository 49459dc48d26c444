"""Shared by the benchmark scripts: run folder → result record, results JSON, and the marked blocks
they rewrite: the full results table in docs/results.md, the compact SST-2 summary in README.md, and
each method's block in its docs/<method>.md (between ``<!-- name:start -->`` and ``<!-- name:end -->``)."""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RESULTS_DOC = DOCS / "results.md"
# The README's compact table: one row per method on SST-2 (quick budget), by results-table label.
SUMMARY_METHODS = ("distill", "distill train_examples=all", "moebert", "cmow", "autotinybert speedup=2", "autotinybert speedup=4")
# foundation.py's `distill` rows train on the budget's 20k examples (train_examples=budget), while the method's
# default is the whole split: the summary says which, so that no reader takes them for the default.
SUMMARY_LABELS = {"distill": "distill train_examples=budget"}


# Issue 39: a 4× student is one measured at least this much faster than the teacher (1×128, one process).
FOUR_X_SPEEDUP = 3.6


def four_x_point(points: list[dict]) -> dict | None:
    """The most accurate of ``points`` ({"score", "speedup", ...}: a student or an export of it) measured at least
    FOUR_X_SPEEDUP× faster than the teacher; None where none was."""
    fast = [p for p in points if p["speedup"] and p["speedup"] >= FOUR_X_SPEEDUP and p["score"] is not None]
    return max(fast, key=lambda p: p["score"], default=None)


# What users could get without distillery on SST-2 when the project started (the figures its brief quotes,
# measured on a 2-core CPU with the built-in teacher): the README summary keeps them beside the students.
# Every run measures its own live baselines (distillery.live_baselines); these are for the published tables only.
SST2_REFERENCE_POINTS: tuple[dict, ...] = (
    {"name": "built-in teacher, fine-tuned (fp32)", "accuracy": 0.873, "latency_speedup": 1.0, "throughput_speedup": 1.0},
    {"name": "same teacher, dynamic int8 quantization", "accuracy": 0.849, "latency_speedup": 2.83, "throughput_speedup": 2.99},
    {"name": "3-layer student from teacher layers 0,2,4 + KD", "accuracy": 0.834, "latency_speedup": 1.92,
     "throughput_speedup": None},
    {"name": "model2vec static embeddings + logistic regression", "accuracy": 0.740, "latency_speedup": None,
     "throughput_speedup": 190.0},  # approximate
)


def add_seeded_run_arguments(parser: argparse.ArgumentParser, name: str, small_task_seeds: str) -> None:
    """The options every seeded comparison script takes: seeds (all tasks, or per task as TASK=S1,S2), budget,
    teacher, runs folder, reuse, extra dotted settings, the results file (benchmarks/results/<name>.json) and
    whether to rewrite its docs/results.md block."""
    parser.add_argument("--seeds", nargs="+", type=int, default=[42], help="Seeds of every task.")
    parser.add_argument("--seeds-for", nargs="*", default=small_task_seeds.split(), metavar="TASK=S1,S2",
                        help=f"Seeds of a task instead of --seeds (default: {small_task_seeds}).")
    parser.add_argument("--budget", default="quick", choices=["quick", "full"])
    parser.add_argument("--teacher", default="minilm")
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--reuse", action="store_true", help="Use finished run folders as they are.")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="Dotted settings for every run (a smoke check: data.train_limit=64 data.dev_limit=32).")
    parser.add_argument("--results", default=str(RESULTS / f"{name}.json"), help="The records' JSON file.")
    parser.add_argument("--no-docs", action="store_true", help="Do not rewrite docs/results.md's block.")


def seeds_by_task(items: list[str]) -> dict[str, list[int]]:
    """``TASK=S1,S2`` items (``--seeds-for``) as {task: seeds}; the first item of a task counts."""
    seeds: dict[str, list[int]] = {}
    for item in items:
        name, _, values = item.partition("=")
        seeds.setdefault(name, [int(s) for s in values.split(",") if s])
    return seeds


def record_from_run(run_dir: Path, method: str, budget: str) -> dict:
    """One results record: bench.json's contract plus method, budget, task metrics and train time."""
    run_dir = Path(run_dir)
    bench = json.loads((run_dir / "bench.json").read_text())
    metrics = json.loads((run_dir / "metrics.json").read_text())
    train = json.loads((run_dir / "train.json").read_text())
    return {
        "method": method,
        "budget": budget,
        "task": metrics["task"],
        "main_metric": metrics["main_metric"],
        "metrics": {"teacher": metrics["teacher"], "student": metrics["student"]},
        "retention": metrics["retention"],
        "train_seconds": train.get("student_seconds"),
        "teacher_train_seconds": train.get("teacher_seconds"),
        "train_examples": train.get("train_examples"),
        "notes": train.get("notes", []),
        "run": str(run_dir),
        **bench,
        **teacher_and_student_names(run_dir),
    }


def run_point(method: str, task: str, out: Path, args, overrides: dict) -> dict:
    """One benchmark point: ``distillery compress --method <method> --task <task>`` into ``out`` with ``overrides``
    (dotted settings) and ``args.set`` (KEY=VALUE, the last word), unless ``args.reuse`` finds that run finished;
    then its results record (:func:`record_from_run`). ``args``: budget, teacher, data_dir, reuse, set."""
    from distillery.config import parse_value
    from distillery.pipeline import build_run_config, compress

    settings = dict(overrides)
    for item in getattr(args, "set", None) or []:
        key, _, value = item.partition("=")
        settings[key] = parse_value(value, key)
    if not (args.reuse and (Path(out) / "report.md").is_file()):
        compress(build_run_config(method=method, task=task, budget=args.budget, teacher=args.teacher,
                                  data_dir=args.data_dir, out=str(out), overrides=settings), overwrite=True)
    return record_from_run(out, method, args.budget)


def measured_on(hardware: dict) -> str:
    """The machine a results block was measured on, in the words every block opens its last lines with."""
    return (f"Measured on {hardware.get('cpu')} ({hardware.get('cores')} cores, {hardware.get('threads')} threads), "
            f"GPU: {hardware.get('gpu') or 'none'}")


def teacher_and_student_names(run_dir: Path) -> dict:
    """Who taught whom, from the run's settings: the teacher as the run named it, and the student's origin (a
    pretrained encoder given with ``--student``, else the method built it from the teacher)."""
    import yaml

    config = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    student = (config.get("method_options") or {}).get("student")
    return {"teacher_name": config["teacher"]["name"],
            "student_origin": student or f"built from the teacher by method {config['method']}"}


def teacher_and_student(run_dir: Path) -> dict:
    """A finished run's teacher and student, loaded, in the order the benchmarks report them."""
    from distillery.runtime import load_model

    train = json.loads((Path(run_dir) / "train.json").read_text())
    return {"teacher": load_model(train["teacher_path"]), "student": load_model(Path(run_dir) / "student")}


def rebench(run_dir: Path, **bench_options) -> None:
    """Measure a finished run's teacher and student again and rewrite bench.json and report.md.

    Training runs share the machine with whatever else is going on; the figures we publish come
    from one quiet pass over all runs, each teacher and student interleaved in one process.
    """
    from distillery.bench import benchmark
    from distillery.report import write_report

    run_dir = Path(run_dir)
    (run_dir / "bench.json").write_text(json.dumps(benchmark(teacher_and_student(run_dir), **bench_options), indent=2))
    write_report(run_dir)


def task_parser(doc: str, tasks: list[str], method: str, variants: bool = True) -> argparse.ArgumentParser:
    """The arguments every benchmark script that runs tasks shares (``--option`` with ``variants``)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--tasks", nargs="+", default=tasks)
    parser.add_argument("--budget", default="quick", choices=["quick", "full"])
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--reuse", action="store_true", help="Use finished run folders as they are.")
    parser.add_argument("--rebench", action="store_true",
                        help="Do not train: measure the finished runs again, on a quiet machine, and record them.")
    if variants:
        parser.add_argument("--option", nargs="+", default=[], metavar="KEY=VALUE",
                            help=f"{method} options of a variant (its own runs and rows).")
    return parser


def run_tasks(method: str, args, task_overrides=lambda task: {}) -> None:
    """``distillery compress --method <method>`` per task of ``args.tasks`` into
    runs/bench-<task>-<method>[-<option values>]-<budget>/ (or ``--rebench`` / ``--reuse`` the finished
    folder), then one record per task in benchmarks/results/<method>[...]-<budget>.json and the results
    tables (docs/results.md, README.md's summary). ``args.option`` (KEY=VALUE method options) makes a variant with its own runs and rows."""
    from distillery.cli import parse_options
    from distillery.pipeline import build_run_config, compress

    options = parse_options(args.option)
    label = " ".join([method, *(f"{k}={v}" for k, v in options.items())])  # the results table's method column
    suffix = "".join(f"-{v}" for v in options.values())
    name = f"{method}{suffix}-{args.budget}"
    for task in args.tasks:
        out = Path(args.runs_dir) / f"bench-{task}-{method}{suffix}-{args.budget}"
        if args.rebench:
            rebench(out)
        elif not (args.reuse and (out / "report.md").is_file()):
            overrides = {f"method_options.{k}": v for k, v in options.items()}
            overrides.update(task_overrides(task))  # a task's own value wins over the variant's
            compress(build_run_config(method=method, task=task, budget=args.budget, data_dir=args.data_dir,
                                      out=str(out), overrides=overrides), overwrite=True)
        record = record_from_run(out, label, args.budget)
        # read again just before writing: several of these scripts may run at once, one task each
        records = {r["task"]: r for r in load_all_results() if r["method"] == label and r["budget"] == args.budget}
        records[task] = record
        save_results(name, list(records.values()))
        update_results_tables(load_all_results())
        print(f"{task}: recorded in benchmarks/results/{name}.json")


def student_score(rec: dict) -> float:
    """The student's main metric in a results record."""
    return rec["metrics"]["student"][rec["main_metric"]]


def save_results(name: str, records: list[dict]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(records, indent=2))
    return path


def upsert_result(name: str, record: dict, key) -> Path:
    """Put ``record`` into benchmarks/results/<name>.json in place of the record with the same
    ``key(record)`` (:func:`upsert_record`)."""
    return upsert_record(RESULTS / f"{name}.json", record, key)


def upsert_record(path: Path, record: dict, key) -> Path:
    """Put ``record`` into the JSON list at ``path`` (a results file, or a smoke check's own) in place of the
    record with the same ``key(record)`` (others keep their order), reading the file again just before writing:
    several benchmark scripts may run at once, on different rows."""
    records = {key(r): r for r in (json.loads(path.read_text()) if path.is_file() else [])}
    records[key(record)] = record
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(list(records.values()), indent=2))
    return path


def mean_std(values: list[float], digits: int = 3) -> str:
    """``mean ± std`` of ``values`` (one value as it is, none as a dash)."""
    if len(values) < 2:
        return f"{values[0]:.{digits}f}" if values else "—"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def load_all_results(variants: bool = False) -> list[dict]:
    """Every teacher-vs-student record under benchmarks/results/. Deployment records
    (benchmarks/deploy.py: a ``variant`` such as ``student-onnx-int8``) have their own table (docs/deployment.md)
    and are left out unless ``variants``; so are ablation runs (``ablation``) and files that are not
    run records (timings, speed tables)."""
    records = []
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        records.extend(data if isinstance(data, list) else [data])
    records = [r for r in records if isinstance(r, dict) and "method" in r and "ablation" not in r]
    return [r for r in records if variants or "variant" not in r]


def _ideal(speedup: dict, key: str) -> str:
    return f" ({speedup[key]:.2f}×)" if key in speedup else ""


def results_table(records: list[dict]) -> str:
    """Markdown: one row per (method, task, budget) record, teacher and student side by side."""
    from distillery.bench import speedup_over

    lines = [
        "| method | task | budget | metric | teacher | student | retention | params T → S | latency 1×128 T / S (ms) | latency speed-up (FLOP-ideal) | throughput speed-up (FLOP-ideal) | student train time |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(records, key=lambda r: (r["method"], r["task"], r["budget"])):
        m = r["main_metric"]
        t, s = r["models"]["teacher"], r["models"]["student"]
        ideal = speedup_over(t, s)  # FLOP ratios from the raw counts: older records lack the stored ones
        lines.append(
            f"| {r['method']} | {r['task']} | {r['budget']} | {m} | {r['metrics']['teacher'][m]:.4f} | "
            f"{r['metrics']['student'][m]:.4f} | {100 * r['retention']:.1f} % | "
            f"{t['params'] / 1e6:.1f}M → {s['params'] / 1e6:.1f}M | "
            f"{t['latency_ms']['median']:.1f} / {s['latency_ms']['median']:.1f} | "
            f"{r['speedup']['latency']:.2f}×{_ideal(ideal, 'flop_ideal_latency')} | "
            f"{r['speedup']['throughput']:.2f}×{_ideal(ideal, 'flop_ideal_throughput')} | "
            f"{(r.get('train_seconds') or 0) / 60:.1f} min |"
        )
    hw = records[0]["hardware"] if records else {}
    if hw:
        lines.append("")
        lines.append(f"Measured on {hw.get('cpu')} ({hw.get('cores')} cores, {hw.get('threads')} threads), "
                     f"torch {hw.get('torch')}, GPU: {hw.get('gpu') or 'none'}.")
    return "\n".join(lines)


def prune_summary_rows(path: Path | None = None) -> list[dict]:
    """The README's rows of method prune (full mode, the default): its SST-2 records of the built-in teacher at the
    quick budget (benchmarks/prune.py), by target. prune's records are its own benchmark's (one per target and
    mode, ``ablation`` set), so :func:`load_all_results` leaves them out; those recorded before ``params`` and
    ``throughput_speedup`` were kept are left out here too."""
    path = path or RESULTS / "prune-minilm-quick.json"
    if not path.is_file():
        return []
    found = [r for r in json.loads(path.read_text())
             if r["task"] == "sst2" and r["mode"] == "full" and r["seed"] == 42 and "params" in r]
    return [{"label": f"prune speedup={r['target_speedup']:g}", "accuracy": r["score"], "retention": r["retention"],
             "params": r["params"], "latency": r["speedup"], "throughput": r["throughput_speedup"],
             "hardware": r["hardware"]} for r in sorted(found, key=lambda r: r["target_speedup"])]


def summary_table(records: list[dict], extra_rows: list[dict] = ()) -> str:
    """Markdown: the README's compact table. The teacher, one SST-2 (quick budget) row per method of
    ``SUMMARY_METHODS`` that has a record, then ``extra_rows`` (:func:`prune_summary_rows`' shape), and the SST-2
    reference points users can get without distillery (SST2_REFERENCE_POINTS, the built-in teacher's fp32 row left
    out)."""

    rows = {r["method"]: r for r in records if r["task"] == "sst2" and r["budget"] == "quick"}
    chosen = [rows[m] for m in SUMMARY_METHODS if m in rows]
    students = [{"label": SUMMARY_LABELS.get(r["method"], r["method"]), "accuracy": r["metrics"]["student"]["accuracy"],
                 "retention": r["retention"], "params": r["models"]["student"]["params"],
                 "latency": r["speedup"]["latency"], "throughput": r["speedup"]["throughput"],
                 "hardware": r["hardware"]} for r in chosen]
    students += list(extra_rows)
    lines = [
        "| model | SST-2 dev accuracy | of the teacher's | params | latency speed-up (1×128) | throughput speed-up (256×64) |",
        "|---|---|---|---|---|---|",
    ]
    if chosen:
        t = chosen[0]
        lines.append(f"| teacher (built-in MiniLM-L6, fine-tuned here) | {t['metrics']['teacher']['accuracy']:.3f} | 100 % | "
                     f"{t['models']['teacher']['params'] / 1e6:.1f}M | 1.00× | 1.00× |")
    for r in students:
        lines.append(f"| `{r['label']}` | {r['accuracy']:.3f} | {100 * r['retention']:.1f} % | "
                     f"{r['params'] / 1e6:.1f}M | {r['latency']:.2f}× | {r['throughput']:.2f}× |")
    for p in SST2_REFERENCE_POINTS[1:]:
        lat, tp = p["latency_speedup"], p["throughput_speedup"]
        lines.append(f"| *reference: {p['name']}* | {p['accuracy']:.3f} | — | — | "
                     f"{'—' if lat is None else f'{lat:.2f}×'} | "
                     f"{'—' if tp is None else (f'~{tp:.0f}×' if tp >= 50 else f'{tp:.2f}×')} |")
    hw = chosen[0]["hardware"] if chosen else {}
    if hw:
        where = f"on {hw.get('cpu')} ({hw.get('cores')} cores, {hw.get('threads')} threads)"
        others = [r for r in students if r["hardware"].get("cpu") != hw.get("cpu")]
        if others:  # rows measured on another machine: a ratio holds within its own record's machine
            cpus = ", ".join(sorted({str(r["hardware"].get("cpu")) for r in others}))
            labels = ", ".join(f"`{r['label']}`" for r in others)
            where += f" (the teacher row's), {cpus} for {labels}"
        lines.append("")
        lines.append(f"Quick budget; each speed-up against the teacher measured in the same process as the student, "
                     f"{where}, torch {hw.get('torch')}, GPU: {hw.get('gpu') or 'none'}. Every task, variant and "
                     f"the speed-up its arithmetic alone would give: [docs/results.md](docs/results.md).")
    return "\n".join(lines)


def replace_block(path: Path, name: str, content: str) -> None:
    """Replace what stands between ``<!-- name:start -->`` and ``<!-- name:end -->`` in ``path``
    (README.md or a docs/ page)."""
    path = Path(path)
    text = path.read_text()
    block = f"<!-- {name}:start -->\n{content}\n<!-- {name}:end -->"
    new, n = re.subn(rf"<!-- {name}:start -->.*?<!-- {name}:end -->", lambda _: block, text, flags=re.S)
    if n != 1:
        raise SystemExit(f"{path} has no <!-- {name}:start --> ... <!-- {name}:end --> block.")
    path.write_text(new)


def update_results_tables(records: list[dict]) -> None:
    """docs/results.md's full table and the README's compact SST-2 summary, made anew from the records."""
    replace_block(RESULTS_DOC, "results", results_table(records))
    replace_block(README, "summary", summary_table(records, prune_summary_rows()))
