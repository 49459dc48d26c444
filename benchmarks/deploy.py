"""Deployment variants of every student type on SST-2 against the free int8 teacher, in one process.

    python benchmarks/deploy.py [RUN ...] --data-dir ../shared/data [--dev-limit N] [--no-recover]

From each run folder (default: the SST-2 quick runs of distill, moebert, cmow and autotinybert that
benchmarks/{foundation,moebert,cmow,autotinybert}.py leave in runs/; they share the fine-tuned teacher
named by train.json's teacher_path) it builds, for the teacher and every student, the ONNX (fp32),
ONNX Runtime int8 and torch int8 exports (parity-checked, see distillery.export; a format a model
cannot take is recorded as skipped with the reason), plus each student in the default int8 backend
after a quantization-aware recovery pass when int8 costs it more than one point; scores every model
on SST-2 dev with its run's data settings; measures all of them in ONE interleaved benchmark; and
writes

- benchmarks/results/deploy-sst2.json: one record per model, in bench.json's contract with
  "teacher" = the fp32 teacher and "student" = the model, plus method, variant, the model's
  metrics and quality drop against its own fp32, and which teacher int8 variants it dominates;
- benchmarks/results/deploy-sst2.png: every model's accuracy against latency, Pareto frontier drawn;
- the block between <!-- deploy:start --> and <!-- deploy:end --> in docs/deployment.md;

and says whether a student + int8 dominates the int8 teacher (strictly faster at 1x128 and strictly
more accurate). Export folders stay in RUN/exports/. Smoke runs: --dev-limit 64 --latency-runs 5
--throughput-runs 1 --recover-steps 20 --results /tmp/deploy.json --no-docs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import DOCS, RESULTS, SST2_REFERENCE_POINTS, replace_block

from distillery.bench import benchmark, format_bench_table, format_hardware
from distillery.cli import setup_logging
from distillery.config import RunConfig
from distillery.errors import DistilleryError
from distillery.evaluation import score
from distillery.export import export_model, prepare_export_data, read_manifest, resolve_format
from distillery.plot import dominates, write_plot
from distillery.runtime import load_model

FORMATS = ("onnx", "onnx-int8", "torch-int8")
DEFAULT_RUNS = ("runs/bench-sst2-distill-quick", "runs/bench-sst2-moebert-quick", "runs/bench-sst2-cmow-quick",
                "runs/bench-sst2-autotinybert-2-quick")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", default=list(DEFAULT_RUNS))
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--teacher", default=None, help="fp32 teacher folder (default: the runs' train.json teacher_path)")
    parser.add_argument("--dev-limit", type=int, default=None, help="Score on the first N dev examples (smoke runs).")
    parser.add_argument("--no-recover", action="store_true", help="Skip the quantization-aware recovery passes.")
    parser.add_argument("--recover-steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=None, help="torch (and ONNX Runtime) threads; default torch's.")
    parser.add_argument("--latency-runs", type=int, default=30)
    parser.add_argument("--throughput-runs", type=int, default=3)
    parser.add_argument("--results", default=str(RESULTS / "deploy-sst2.json"))
    parser.add_argument("--no-docs", "--no-readme", dest="no_docs", action="store_true",
                        help="Do not rewrite the deploy block of docs/deployment.md.")
    args = parser.parse_args()
    setup_logging()
    started = time.time()
    recover = not args.no_recover

    runs = {}  # label -> (run folder, config, train.json)
    for folder in map(Path, args.runs):
        config = RunConfig.load(folder / "config.yaml")
        label = config.method if config.method not in runs else folder.name
        runs[label] = (folder, config, json.loads((folder / "train.json").read_text()))
    teachers = {str(train["teacher_path"]) for _, _, train in runs.values()}
    if not args.teacher and len(teachers) > 1:
        raise SystemExit(f"The runs were distilled from different teachers ({', '.join(sorted(teachers))}); pass --teacher.")
    teacher_path = Path(args.teacher or teachers.pop())
    first_run, first_config, first_train = next(iter(runs.values()))

    from transformers import AutoTokenizer

    sources = {"teacher": teacher_path, **{label: folder / "student" for label, (folder, _, _) in runs.items()}}
    fp32 = {name: load_model(path) for name, path in sources.items()}
    task_data, metrics = {}, {}
    for name, path in sources.items():
        run = first_run if name == "teacher" else runs[name][0]
        task_data[name] = prepare_export_data(first_config.data.task, AutoTokenizer.from_pretrained(path), run,
                                              args.data_dir, splits=("train", "dev") if recover and name != "teacher" else ("dev",),
                                              dev_limit=args.dev_limit)
        metrics[name] = score(fp32[name], task_data[name])
        print(f"{name}: {metrics[name]}", flush=True)
    main_metric = task_data["teacher"].task.main_metric

    folders: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    for name, path in sources.items():
        exports = (first_run if name == "teacher" else runs[name][0]) / "exports"
        jobs = [(f"{name}-{fmt}", fmt, False) for fmt in FORMATS]
        if recover and name != "teacher":
            int8 = resolve_format("int8", fp32[name].config.model_type)  # the faster int8 backend of this type
            jobs.append((f"{name}-{int8}-recovered", int8, True))
        for key, fmt, recovered in jobs:
            print(f"exporting {key}", flush=True)
            extra = dict(recover=True, recover_teacher=teacher_path, recover_steps=args.recover_steps) if recovered else {}
            try:
                folders[key] = export_model(path, fmt, exports / key, task_data=task_data[name],
                                            source_metrics=metrics[name], overwrite=True, **extra)
            except DistilleryError as e:
                skipped[key] = str(e)
                print(f"  skipped: {e}", flush=True)
                continue
            recovery = read_manifest(folders[key]).get("recovery", {}) if recovered else {}
            if recovered and not recovery.get("kept"):  # the same model as {name}-{int8}: not measured twice
                skipped[key] = recovery.get("skipped") or recovery.get("note") or "recovery not kept"
                print(f"  not kept: {skipped[key]}", flush=True)
                del folders[key]
    manifests = {key: read_manifest(folder) for key, folder in folders.items()}
    for key, manifest in manifests.items():
        metrics[key] = manifest["scores"]["export"]

    models = {**fp32, **{key: load_model(folder) for key, folder in folders.items()}}
    bench = benchmark(models, threads=args.threads, latency_runs=args.latency_runs,
                      throughput_runs=args.throughput_runs)
    print(format_bench_table(bench))

    records = build_records(runs, first_train, metrics, manifests, bench, main_metric,
                            len(task_data["teacher"].dev_examples))
    path = Path(args.results)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"records": records, "skipped": skipped}, indent=2) + "\n")
    plot = write_plot([{"label": r["variant"], "latency_ms": r["models"]["student"]["latency_ms"]["median"],
                        "metric": r["metrics"]["student"][main_metric]} for r in records],
                      path.with_suffix(".png"), f"SST-2 dev {main_metric}",
                      title="Teacher and students, fp32 / ONNX / int8, 1×128 latency, one process")
    table = deploy_table(records, bench, main_metric, skipped, plot)
    print(table)
    if not args.no_docs:
        replace_block(DOCS / "deployment.md", "deploy", table)
    print(f"Wrote {path} and {plot} in {(time.time() - started) / 60:.1f} min.")


def _source(name: str, runs: dict) -> str:
    """The fp32 model a variant came from: "teacher" or a run label."""
    return max((label for label in ("teacher", *runs) if name == label or name.startswith(label + "-")), key=len)


def _row(name: str, metrics: dict, bench: dict, main: str) -> dict:
    m = bench["models"][name]
    return {"model": name, "main": metrics[name][main], "latency_ms": m["latency_ms"]["median"],
            "throughput": m["throughput"]["sentences_per_s"]}


def build_records(runs, first_train, metrics, manifests, bench, main, dev_examples) -> list[dict]:
    """One record per model: bench.json's contract with the fp32 teacher as "teacher" and the
    model as "student", measured in the one benchmark above."""
    teacher = bench["models"]["teacher"]
    rows = {name: _row(name, metrics, bench, main) for name in bench["models"]}
    teacher_variants = [n for n in rows if n.startswith("teacher-")]
    records = []
    for name, model in bench["models"].items():
        speedup = {"latency": teacher["latency_ms"]["median"] / model["latency_ms"]["median"],
                   "throughput": model["throughput"]["sentences_per_s"] / teacher["throughput"]["sentences_per_s"]}
        source = _source(name, runs)
        run, config, train = runs[source] if source != "teacher" else (None, None, first_train)
        manifest = manifests.get(name, {})
        record = {
            "method": "teacher" if source == "teacher" else config.method,
            "budget": config.budget if config else None,
            "variant": name,
            "task": "sst2",
            "main_metric": main,
            "dev_examples": dev_examples,
            "metrics": {"teacher": metrics["teacher"], "student": metrics[name]},
            "retention": metrics[name][main] / metrics["teacher"][main],
            "drop_points_vs_fp32": (manifest.get("scores") or {}).get("drop_points", 0.0),
            "train_seconds": train.get("teacher_seconds") if source == "teacher" else train.get("student_seconds"),
            "run": str(run) if run else None,
            "hardware": bench["hardware"],
            "models": {"teacher": teacher, "student": model},
            "speedup": speedup,
            "settings": bench["settings"],
        }
        if manifest:
            record["export"] = {k: manifest[k] for k in ("format", "backend", "exporter", "quantization", "parity",
                                                         "recovery") if k in manifest}
            recovery = manifest.get("recovery") or {}
            if recovery.get("seconds") and record["train_seconds"] is not None:
                record["train_seconds"] += recovery["seconds"]
        if source != "teacher":
            record["dominates"] = [t for t in teacher_variants if dominates(rows[name], rows[t])]
        records.append(record)
    return records


def deploy_table(records: list[dict], bench: dict, main: str, skipped: dict, plot: Path) -> str:
    settings, first = bench["settings"], next(iter(bench["models"].values()))
    lat_shape = f"{first['latency_ms']['batch']}×{first['latency_ms']['seq']}"
    tp_shape = f"{first['throughput']['batch']}×{first['throughput']['seq']}"
    lines = [
        f"| model | method | {main} | drop vs its fp32 (points) | latency {lat_shape} (ms) | latency speed-up | "
        f"throughput {tp_shape} (sent/s) | throughput speed-up | backend |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        m = r["models"]["student"]
        lines.append(
            f"| {r['variant']} | {r['method']} | {r['metrics']['student'][main]:.4f} | {r['drop_points_vs_fp32']:+.2f} | "
            f"{m['latency_ms']['median']:.1f} | {r['speedup']['latency']:.2f}× | "
            f"{m['throughput']['sentences_per_s']:.1f} | {r['speedup']['throughput']:.2f}× | "
            f"{m.get('backend', 'torch fp32')} |"
        )
    n = records[0]["dev_examples"]
    lines += ["", f"SST-2 dev ({n} examples), each run's data settings; every model measured in one interleaved "
                  f"benchmark ({settings['latency_runs']} latency runs) on {format_hardware(bench['hardware'])}. "
                  f"`-recovered`: after the quantization-aware recovery pass (only where int8 lost more than a "
                  f"point and the pass helped).", ""]
    for key, why in skipped.items():
        lines.append(f"- `{key}` not measured: {why}")
    lines += ["", f"![accuracy against latency](../benchmarks/results/{plot.name})", "", verdict(records, main)]
    return "\n".join(lines)


def verdict(records: list[dict], main: str) -> str:
    by = {r["variant"]: r for r in records}
    students = [r for r in records if r["method"] != "teacher" and "int8" in r["variant"]]
    sentences = []
    for t in [r for r in records if r["variant"].startswith("teacher-") and "int8" in r["variant"]]:
        winners = [s["variant"] for s in students if t["variant"] in s.get("dominates", [])]
        t_desc = (f"`{t['variant']}` ({main} {t['metrics']['student'][main]:.4f}, "
                  f"{t['speedup']['latency']:.2f}× at 1×128)")
        if winners:
            w = max((by[v] for v in winners), key=lambda r: r["metrics"]["student"][main])
            sentences.append(f"{t_desc} is dominated by `{w['variant']}` ({w['metrics']['student'][main]:.4f}, "
                             f"{w['speedup']['latency']:.2f}×)" + (f" and {len(winners) - 1} other student int8 variant(s)" if len(winners) > 1 else "") + ".")
        else:
            sentences.append(f"{t_desc} is not dominated by any student int8 variant.")
    ref = SST2_REFERENCE_POINTS[1]
    beat = [s for s in students if s["metrics"]["student"][main] > ref["accuracy"]
            and s["speedup"]["latency"] > ref["latency_speedup"] and s["speedup"]["throughput"] > ref["throughput_speedup"]]
    sentences.append(
        f"Against the issue's reference int8 teacher ({ref['accuracy']:.3f}, {ref['latency_speedup']:.2f}× latency, "
        f"{ref['throughput_speedup']:.2f}× throughput): "
        + (f"dominated by {', '.join('`' + s['variant'] + '`' for s in beat)}." if beat else "no student int8 variant dominates it.")
    )
    any_win = any(s.get("dominates") for s in students)
    return ("**A student + int8 dominates the int8 teacher measured here.** " if any_win
            else "**No student + int8 dominates the int8 teacher measured here.** ") + " ".join(sentences)


if __name__ == "__main__":
    main()
