"""Issue 54: token classification (named entities) in every method, CoNLL-2003, built-in teacher, quick budget.

    python benchmarks/ner.py --data-dir ../shared/data                          # every point of POINTS
    python benchmarks/ner.py --points distill-2x distill-4x --seeds 42 43
    python benchmarks/ner.py --rebench      # time every recorded run's models again, side by side, on a quiet machine

Per point and seed: ``distillery compress --task conll2003 --method M`` (with the point's options) into
runs/ner-<point>-s<seed>-<budget>/. Every seed distils the same teacher (fine-tuned once, cached). The run scores
the teacher and the student on dev and test; this script scores each export of the student (ONNX, int8) on test
too, so that every point (the student and each export) has ``retention`` on dev and ``test_retention`` on test
beside the latency speed-up measured in the run (1×128, teacher and student in one process).

One record per run goes to benchmarks/results/ner-conll2003.json (task, method, point, seed, points, the static
embedding baseline where the run measured it, training time, teacher, hardware) and a table to docs/results.md's
ner block, with the issue's acceptance lines: the best point at about 2× keeps ≥ 99 % of the teacher's entity F1
on test, the best at about 4× ≥ 97 %.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from common import FOUR_X_SPEEDUP, RESULTS, RESULTS_DOC, add_seeded_run_arguments, mean_std, measured_on, replace_block, \
    run_point, upsert_record

NAME = "ner"
TASK = "conll2003"
# point -> (method, options): each method near 2× and near 4× on the built-in teacher (6 layers of 384). The int8
# export of each run is a point of its own (about 2× more again), so the 2× students' exports are 4× points too.
POINTS = {
    "distill-2x": ("distill", {"student_layers": 3}),
    "distill-4x": ("distill", {"student_layers": 2}),
    "moebert-2x": ("moebert", {}),
    "autotinybert-2x": ("autotinybert", {"speedup": 2}),
    "autotinybert-4x": ("autotinybert", {"speedup": 4}),
    "cmow": ("cmow", {}),
}
TWO_X_SPEEDUP = 1.8  # a point counts as about 2× from this measured latency speed-up (4×: common.FOUR_X_SPEEDUP)
BARS = ((TWO_X_SPEEDUP, 0.99, "2×"), (FOUR_X_SPEEDUP, 0.97, "4×"))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--points", nargs="+", default=list(POINTS), choices=sorted(POINTS))
    parser.add_argument("--rebench", action="store_true",
                        help="Train nothing: time the teacher and every recorded point's model again in one process "
                             f"(its bench record: benchmarks/results/{NAME}-rebench.json) and take those speed-ups.")
    add_seeded_run_arguments(parser, f"{NAME}-{TASK}", "")
    return parser.parse_args(argv)


def overrides(point: str, seed: int, args) -> dict:
    settings = {f"method_options.{k}": v for k, v in POINTS[point][1].items()}
    settings["student.seed"] = seed
    return settings


def test_scores(out: Path, exports: list[str], args) -> dict[str, float]:
    """Entity F1 on test of each export folder of the run (the run itself scores the teacher and student)."""
    from distillery.evaluation import evaluate

    scores = {}
    for name in exports:
        folder = out / "exports" / name
        if folder.is_dir():
            scored = evaluate(str(folder), task=TASK, data_dir=args.data_dir, split="test")
            scores[name] = scored["metrics"][scored["main_metric"]]
    return scores


def record(out: Path, point: str, seed: int, args) -> dict:
    from distillery.bench import hardware_fingerprint
    from distillery.run_record import STATIC_NAME, load_run, run_rows

    method = POINTS[point][0]
    base = run_point(method, TASK, out, args, overrides(point, seed, args))
    main = base["main_metric"]
    metrics = json.loads((out / "metrics.json").read_text())
    test = (metrics.get("other_splits") or {}).get("test") or {}
    teacher_dev, teacher_test = base["metrics"]["teacher"][main], (test.get("teacher") or {}).get(main)
    rows = {r["model"]: r for r in run_rows(load_run(out))}
    models = [name for name in rows if name == "student" or name.startswith("student-")]
    on_test = {"student": (test.get("student") or {}).get(main),
               **test_scores(out, [m for m in models if m != "student"], args)}
    pts = []
    for name in models:
        r = rows[name]
        t = on_test.get(name)
        pts.append({"model": name, "score": r["main"], "speedup": r["latency_speedup"],
                    "retention": r["main"] / teacher_dev if r["main"] is not None and teacher_dev else None,
                    "test_score": t, "test_retention": t / teacher_test if t is not None and teacher_test else None})
    static = rows.get(STATIC_NAME)
    return {
        "ablation": NAME, "task": TASK, "method": method, "point": point, "seed": seed, "main_metric": main,
        "teacher_score": teacher_dev, "teacher_test_score": teacher_test, "points": pts,
        "static": {"score": static["main"], "speedup": static["latency_speedup"]} if static else None,
        "train_seconds": base["train_seconds"], "teacher_train_seconds": base["teacher_train_seconds"],
        "notes": base["notes"], "teacher": args.teacher, "budget": args.budget,
        "hardware": base.get("hardware") or hardware_fingerprint(), "run": str(out),
    }


def best_at(records: list[dict], speedup: float) -> dict | None:
    """The point (over every run) with the highest test retention among those measured at least ``speedup``× faster."""
    candidates = [{**p, "point": r["point"], "seed": r["seed"]} for r in records for p in r["points"]
                  if p["speedup"] and p["speedup"] >= speedup and p["test_retention"] is not None]
    return max(candidates, key=lambda p: p["test_retention"], default=None)


def speedup_cell(speedups: list[float | None]) -> str:
    """The mean of the measured speed-ups; — where none was kept (a run whose timings were disturbed)."""
    kept = [v for v in speedups if v]
    return f"{statistics.mean(kept):.2f}×" if kept else "—"


def table(records: list[dict]) -> str:
    lines = ["| point | model | seeds | entity F1 dev | retention dev | entity F1 test | retention test | "
             "latency speed-up | training (s) |", "|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], list[tuple[dict, dict]]] = {}
    for r in records:
        for p in r["points"]:
            groups.setdefault((r["point"], p["model"]), []).append((r, p))
    for (point, model), items in sorted(groups.items(), key=lambda kv: (list(POINTS).index(kv[0][0])
                                                                         if kv[0][0] in POINTS else 99, kv[0][1])):
        ps = [p for _, p in items]
        tests = [p["test_score"] for p in ps if p["test_score"] is not None]
        test_ret = [100 * p["test_retention"] for p in ps if p["test_retention"] is not None]
        lines.append(f"| {point} | `{model}` | {len(ps)} | {mean_std([p['score'] for p in ps])} | "
                     f"{mean_std([100 * p['retention'] for p in ps], 1)} % | {mean_std(tests) if tests else '—'} | "
                     f"{mean_std(test_ret, 1) + ' %' if test_ret else '—'} | "
                     f"{speedup_cell([p['speedup'] for p in ps])} | "
                     f"{statistics.mean(r['train_seconds'] or 0 for r, _ in items):.0f} |")
    if not records:
        return "\n".join(lines)
    first = records[0]
    statics = [r["static"] for r in records if r.get("static")]
    if statics:
        lines.append(f"| *live baseline: static embeddings* | — | {len(statics)} | "
                     f"{mean_std([s['score'] for s in statics])} | "
                     f"{mean_std([100 * s['score'] / first['teacher_score'] for s in statics], 1)} % | — | — | "
                     f"{speedup_cell([s['speedup'] for s in statics])} | — |")
    hw = first["hardware"]
    lines += ["", f"Teacher ({first['teacher']}, fine-tuned at the {first['budget']} budget): entity F1 "
                  f"{first['teacher_score']:.4f} on dev, "
                  f"{first['teacher_test_score']:.4f} on test." if first.get("teacher_test_score") is not None else "",
              measured_on(hw) + "; speed-ups at 1×128, teacher and student in one process.", ""]
    for speedup, bar, label in BARS:
        best = best_at(records, speedup)
        if best is None:
            lines.append(f"About {label} (≥ {speedup:g}× measured): no point measured. Asked: ≥ {bar:.0%} on test.")
            continue
        met = best["test_retention"] >= bar
        lines.append(f"About {label} (≥ {speedup:g}× measured): best `{best['point']}` `{best['model']}` (seed "
                     f"{best['seed']}) keeps {100 * best['test_retention']:.1f} % of the teacher's entity F1 on test "
                     f"at {best['speedup']:.2f}×. Asked: ≥ {bar:.0%}: {'met' if met else 'NOT met'}.")
    return "\n".join(lines)


def rebench(results: Path, args) -> None:
    """Time the teacher and every recorded point's model (each run's student and exports) again, interleaved in one
    process, and make those the points' speed-ups. A run times its own models while it trains nothing else, but
    other work on the cores disturbs it (its report flags that); ``speedup_as_recorded`` keeps the run's figure."""
    from distillery.bench import benchmark, save_bench
    from distillery.runtime import load_model

    records = json.loads(results.read_text())
    teachers = {json.loads((Path(r["run"]) / "train.json").read_text())["teacher_path"] for r in records}
    if len(teachers) != 1:
        raise SystemExit(f"the records distil {len(teachers)} teachers; --rebench compares one: {sorted(teachers)}")
    folders = {f"{r['point']}-s{r['seed']}/{p['model']}":
               Path(r["run"]) / ("student" if p["model"] == "student" else f"exports/{p['model']}")
               for r in records for p in r["points"]}
    bench = benchmark({"teacher": load_model(teachers.pop()), **{k: load_model(str(f)) for k, f in folders.items()}},
                      threads=records[0]["hardware"].get("threads"))
    if not bench["noise"]["stable"]:
        raise SystemExit(f"the timings were disturbed ({'; '.join(bench['noise']['reasons'])}): run it again on a "
                         "quiet machine")
    out = save_bench(bench, RESULTS / f"{NAME}-rebench.json")
    for r in records:
        r.pop("timing_disturbed", None)
        for p in r["points"]:
            p.setdefault("speedup_as_recorded", p["speedup"])
            p["speedup"] = bench["speedups"][f"{r['point']}-s{r['seed']}/{p['model']}"]["latency"]
        if r.get("static"):  # the baseline is not saved, so it cannot be timed again: its run's figure is left out
            r["static"].setdefault("speedup_as_recorded", r["static"]["speedup"])
            r["static"]["speedup"] = None
        r["speedups_measured"] = f"again, every point side by side in one process: {out.name}"
    results.write_text(json.dumps(records, indent=2) + "\n")
    if not args.no_docs:
        replace_block(RESULTS_DOC, NAME, table(records))
    print(f"{len(folders)} models timed again beside the teacher: {results}, {out}")


def main(argv=None) -> None:
    from distillery.cli import setup_logging

    args = parse_args(argv)
    setup_logging()
    results = Path(args.results)
    if args.rebench:
        return rebench(results, args)
    for seed in args.seeds:
        for point in args.points:
            out = Path(args.runs_dir) / f"ner-{point}-s{seed}-{args.budget}"
            new = record(out, point, seed, args)
            upsert_record(results, new, lambda r: (r["point"], r["seed"], r["budget"]))
            if not args.no_docs:
                replace_block(RESULTS_DOC, NAME, table(json.loads(results.read_text())))
            print(f"{point} seed {seed}: recorded in {results}")


if __name__ == "__main__":
    main()
