"""Deployment variants of a finished SST-2 run against the free int8 teacher, measured in one process.

    python benchmarks/deploy.py [RUN] --data-dir ../shared/data [--dev-limit N] [--no-recover]

From the run folder (default runs/bench-sst2-distill-quick: its student/, and train.json's
teacher_path for the fine-tuned teacher) it builds, for teacher and student, the ONNX (fp32),
ONNX Runtime int8 and torch int8 exports (parity-checked, see distillery.export), plus the student
in the default int8 backend after a quantization-aware recovery pass when int8 costs it more than
one point; scores every model on SST-2 dev with the run's data settings; measures all of them in
ONE interleaved benchmark; and writes

- benchmarks/results/deploy-sst2.json: one record per variant, in bench.json's contract with
  "teacher" = the fp32 teacher and "student" = the variant, plus method, budget, variant, the
  variant's metrics and quality drop, and which teacher variants it dominates;
- the README block between <!-- deploy:start --> and <!-- deploy:end -->;

and says whether a student + int8 dominates the int8 teacher (strictly faster at 1x128 and strictly more
accurate). Export folders stay in RUN/exports/. Smoke runs: --dev-limit 64 --latency-runs 5
--recover-steps 20 --results /tmp/deploy.json --exports-dir /tmp/exports --no-readme.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import RESULTS, replace_readme_block

from distillery.bench import benchmark, format_bench_table, format_hardware
from distillery.cli import setup_logging
from distillery.config import RunConfig
from distillery.evaluation import score
from distillery.export import DEFAULT_INT8, export_model, prepare_export_data, read_manifest
from distillery.modeling import load_model
from distillery.report import SST2_REFERENCE_POINTS, dominates

FORMATS = ("onnx", "onnx-int8", "torch-int8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", nargs="?", default="runs/bench-sst2-distill-quick")
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--teacher", default=None, help="fp32 teacher folder (default: train.json's teacher_path)")
    parser.add_argument("--dev-limit", type=int, default=None, help="Score on the first N dev examples (smoke runs).")
    parser.add_argument("--no-recover", action="store_true", help="Skip the quantization-aware recovery pass.")
    parser.add_argument("--recover-steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=None, help="torch (and ONNX Runtime) threads; default torch's.")
    parser.add_argument("--latency-runs", type=int, default=30)
    parser.add_argument("--throughput-runs", type=int, default=3)
    parser.add_argument("--results", default=str(RESULTS / "deploy-sst2.json"))
    parser.add_argument("--exports-dir", default=None, help="Where the export folders go (default RUN/exports).")
    parser.add_argument("--no-readme", action="store_true", help="Do not rewrite the README's deploy block.")
    args = parser.parse_args()
    setup_logging()
    started = time.time()

    run = Path(args.run)
    config = RunConfig.load(run / "config.yaml")
    train = json.loads((run / "train.json").read_text())
    teacher_path = Path(args.teacher or train["teacher_path"])
    sources = {"teacher": teacher_path, "student": run / "student"}
    fp32 = {name: load_model(path) for name, path in sources.items()}
    if fp32["teacher"].config.vocab_size != fp32["student"].config.vocab_size:
        raise SystemExit("Teacher and student have different vocabularies; this script expects a distilled student.")

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run / "student")
    recover = not args.no_recover
    task_data = prepare_export_data(config.data.task, tokenizer, run, args.data_dir,
                                    splits=("train", "dev") if recover else ("dev",), dev_limit=args.dev_limit)
    metrics = {name: score(model, task_data) for name, model in fp32.items()}
    main_metric = task_data.task.main_metric

    exports = Path(args.exports_dir) if args.exports_dir else run / "exports"
    folders: dict[str, Path] = {}
    for name, path in sources.items():
        for fmt in FORMATS:
            key = f"{name}-{fmt}"
            print(f"exporting {key}", flush=True)
            folders[key] = export_model(path, fmt, exports / key, task_data=task_data, source_metrics=metrics[name],
                                        overwrite=True)
    if recover:
        key = f"student-{DEFAULT_INT8}-recovered"
        print(f"exporting {key} (recovery pass when int8 loses more than 1 point)", flush=True)
        folders[key] = export_model(sources["student"], DEFAULT_INT8, exports / key, task_data=task_data,
                                    source_metrics=metrics["student"], recover=True,
                                    recover_teacher=teacher_path, recover_steps=args.recover_steps, overwrite=True)
    manifests = {key: read_manifest(folder) for key, folder in folders.items()}
    for key, manifest in manifests.items():
        metrics[key] = manifest["scores"]["export"]

    models = {**fp32, **{key: load_model(folder) for key, folder in folders.items()}}
    bench = benchmark(models, threads=args.threads, latency_runs=args.latency_runs,
                      throughput_runs=args.throughput_runs)
    print(format_bench_table(bench))

    records = build_records(run, config, train, metrics, manifests, bench, main_metric, len(task_data.dev_examples))
    path = Path(args.results)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records, indent=2) + "\n")
    table = deploy_table(records, bench, main_metric)
    print(table)
    if not args.no_readme:
        replace_readme_block("deploy", table)
    print(f"Wrote {path} in {(time.time() - started) / 60:.1f} min.")


def _row(name: str, metrics: dict, bench: dict, main: str) -> dict:
    m = bench["models"][name]
    return {"model": name, "main": metrics[name][main], "latency_ms": m["latency_ms"]["median"],
            "throughput": m["throughput"]["sentences_per_s"]}


def build_records(run, config, train, metrics, manifests, bench, main, dev_examples) -> list[dict]:
    """One record per model: bench.json's contract with the fp32 teacher as "teacher" and the
    variant as "student", measured in the one benchmark above."""
    teacher = bench["models"]["teacher"]
    rows = {name: _row(name, metrics, bench, main) for name in bench["models"]}
    teacher_variants = [n for n in rows if n.startswith("teacher-")]
    records = []
    for name, model in bench["models"].items():
        speedup = {"latency": teacher["latency_ms"]["median"] / model["latency_ms"]["median"],
                   "throughput": model["throughput"]["sentences_per_s"] / teacher["throughput"]["sentences_per_s"]}
        source = "teacher" if name.startswith("teacher") else "student"
        manifest = manifests.get(name, {})
        record = {
            "method": "teacher" if source == "teacher" else config.method,
            "budget": config.budget,
            "variant": name,
            "task": config.data.task,
            "main_metric": main,
            "dev_examples": dev_examples,
            "metrics": {"teacher": metrics["teacher"], "student": metrics[name]},
            "retention": metrics[name][main] / metrics["teacher"][main],
            "drop_points_vs_fp32": (manifest.get("scores") or {}).get("drop_points", 0.0),
            "train_seconds": (train.get("student_seconds") if source == "student" else train.get("teacher_seconds")),
            "run": str(run),
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
        if source == "student":
            record["dominates"] = [t for t in teacher_variants if dominates(rows[name], rows[t])]
        records.append(record)
    return records


def deploy_table(records: list[dict], bench: dict, main: str) -> str:
    settings, first = bench["settings"], next(iter(bench["models"].values()))
    lat_shape = f"{first['latency_ms']['batch']}×{first['latency_ms']['seq']}"
    tp_shape = f"{first['throughput']['batch']}×{first['throughput']['seq']}"
    lines = [
        f"| model | {main} | drop vs its fp32 (points) | latency {lat_shape} (ms) | latency speed-up | "
        f"throughput {tp_shape} (sent/s) | throughput speed-up | backend |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        m = r["models"]["student"]
        lines.append(
            f"| {r['variant']} | {r['metrics']['student'][main]:.4f} | {r['drop_points_vs_fp32']:+.2f} | "
            f"{m['latency_ms']['median']:.1f} | {r['speedup']['latency']:.2f}× | "
            f"{m['throughput']['sentences_per_s']:.1f} | {r['speedup']['throughput']:.2f}× | "
            f"{m.get('backend', 'torch fp32')} |"
        )
    n = records[0]["dev_examples"]
    lines += ["", f"SST-2 dev ({n} examples), the run's data settings; every model measured in one interleaved "
                  f"benchmark ({settings['latency_runs']} latency runs) on {format_hardware(bench['hardware'])}.", ""]
    lines.append(verdict(records, main))
    return "\n".join(lines)


def verdict(records: list[dict], main: str) -> str:
    by = {r["variant"]: r for r in records}
    students = [r for r in records if r["variant"].startswith("student-") and "int8" in r["variant"]]
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
