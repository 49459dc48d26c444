"""Issue 39: distillery's 4× student with and without more text (TinyBERT's augmentation, and a corpus-pre-trained
AutoTinyBERT super-network when one is given), same teacher and seed per row, built-in teacher, quick budget.

    python benchmarks/augment.py --data-dir ../shared/data                       # SST-2, MRPC, RTE, STS-B
    python benchmarks/augment.py --data-dir ../shared/data --supernet runs/pretrained-supernet
    python benchmarks/augment.py --tasks mrpc --seeds-for mrpc=42,43,44 --variants none augment

Per task, seed and variant: ``distillery compress --method autotinybert --speedup 4`` (``--methods`` adds others of
CANDIDATES, e.g. ``distill`` or ``autotinybert-2x``) into runs/augment-<task>-<label>-<variant>-s<seed>/:

none      the student's text is the train split (the quick budget's default: augment=0)
augment   plus ``--augment N`` TinyBERT examples per train example (default 20), labelled by the teacher
supernet  augment, with the search starting from ``--supernet FOLDER`` (``--option supernet=FOLDER``, a super-net
          pre-trained on a corpus: `distillery autotinybert pretrain --corpus`); autotinybert only
unlabeled the train split plus ``--unlabeled-file F`` (``--unlabeled-file``: in-domain text the teacher labels, e.g.
          a transfer set of corpus sentence pairs, `distillery transfer-set`), without augmentation

One record per run goes to benchmarks/results/augment-4x.json (task, method, variant, augment, seed, retention,
measured latency speed-up, train_seconds with the augmentation and the teacher's labelling in it, teacher,
student, hardware fingerprint) and the mean ± std per task and variant to docs/results.md's augment block.
The records carry ``ablation`` so that the main results table leaves them out.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from common import (FOUR_X_SPEEDUP, RESULTS_DOC, add_seeded_run_arguments, four_x_point, mean_std, measured_on, record_from_run,
                    replace_block, seeds_by_task, upsert_record)

NAME = "augment-4x"
VARIANTS = ("none", "augment", "supernet", "unlabeled")
# label -> (method, options): the students that can be the 4× point on the built-in teacher (6 layers). AutoTinyBERT
# searched at 4×, and at 2× with its int8 export (made by every run: about 2× from the search, 2× from int8); the
# 3-layer layer-drop student, whose int8 export is the 4× point likewise. CMOW (far past 4×) for the CMOW paper's
# own claim: Table 8, augmentation lifts its students (+3.6 on STS-B). MoEBERT keeps all 6 layers (one of 4 experts
# per token): the most accurate student near 1.7×, but its int8 export was measured at 2.9× on RTE, short of 4×.
CANDIDATES = {"autotinybert": ("autotinybert", {"speedup": 4}), "autotinybert-2x": ("autotinybert", {"speedup": 2}),
              "distill": ("distill", {"student_layers": 3}), "cmow": ("cmow", {}), "moebert": ("moebert", {})}
TASKS = ("sst2", "mrpc", "rte", "stsb")  # issue 39's four
SMALL_TASK_SEEDS = "mrpc=42,43,44 rte=42,43,44"


# the seeds a variant needs to count in the acceptance line: issue 39 asks three for MRPC and RTE, one elsewhere
SEEDS_ASKED = {task: len(seeds) for task, seeds in seeds_by_task(SMALL_TASK_SEEDS.split()).items()}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--methods", nargs="+", default=["autotinybert"], choices=sorted(CANDIDATES),
                        help="Candidate students (CANDIDATES): a method, or a method at another budget.")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--augment", type=int, default=20, help="N of the augment and supernet variants.")
    parser.add_argument("--supernet", help="A pre-trained super-net folder (variant supernet; skipped without it).")
    parser.add_argument("--unlabeled-file", help="Text without labels (variant unlabeled; skipped without it).")
    add_seeded_run_arguments(parser, NAME, SMALL_TASK_SEEDS)
    return parser.parse_args(argv)


def seeds_of(task: str, args) -> list[int]:
    return seeds_by_task(args.seeds_for).get(task, list(args.seeds))


def runs(args) -> list[tuple[str, str, str, int]]:
    """(task, method, variant, seed) of every run asked for, the variants of one seed together."""
    given = {"supernet": args.supernet, "unlabeled": args.unlabeled_file}
    variants = [v for v in args.variants if given.get(v, True)]
    return [(task, method, variant, seed) for task in args.tasks for seed in seeds_of(task, args)
            for method in args.methods for variant in variants if variant != "supernet" or CANDIDATES[method][0] == "autotinybert"]


def overrides(method: str, variant: str, seed: int, args) -> dict:
    from distillery.config import parse_value

    settings = {f"method_options.{k}": v for k, v in CANDIDATES[method][1].items()}
    settings["method_options.augment"] = 0 if variant in ("none", "unlabeled") else args.augment
    if variant == "unlabeled":
        settings["data.unlabeled_file"] = str(Path(args.unlabeled_file).resolve())
    if variant == "supernet":
        settings["method_options.supernet"] = str(args.supernet)
    # the student's seed only: every seed of a task distils the same teacher (fine-tuned once, cached), so the
    # spread is the student's; the augmentation draws from the student's seed too
    settings["student.seed"] = seed
    for item in args.set:
        key, _, value = item.partition("=")
        settings[key] = parse_value(value, key)
    return settings


def points(out: Path) -> list[dict]:
    """The student and its exports as measured in the run (speed-ups over the teacher of the same process)."""
    from distillery.run_record import load_run, run_rows

    return [{"model": r["model"], "score": r["main"], "speedup": r["latency_speedup"]}
            for r in run_rows(load_run(out)) if r["model"] == "student" or r["model"].startswith("student-")]


def record(out: Path, task: str, method: str, variant: str, seed: int, args) -> dict:
    from distillery.bench import hardware_fingerprint

    base = record_from_run(out, method, args.budget)
    pts = points(out)
    teacher_main = base["metrics"]["teacher"][base["main_metric"]]
    for p in pts:
        p["retention"] = p["score"] / teacher_main if teacher_main else None
    best = four_x_point(pts)
    train = json.loads((out / "train.json").read_text())
    text = train.get("student_text") or {}
    student = next((n for n in base["notes"] if n.startswith(("Architecture", "Student"))), method)
    return {
        "ablation": NAME, "task": task, "method": method, "variant": variant, "seed": seed,
        # N as run: the cap on new rows lowers it for a large split (SST-2)
        "augment": (text.get("augmented") or 0) // max(1, text.get("labelled") or 1), "teacher": args.teacher,
        "student": student,
        "retention": base["retention"], "speedup": base["speedup"]["latency"], "points": pts, "four_x": best,
        "train_seconds": base["train_seconds"], "labelling_seconds": text.get("labelling_seconds"),
        "student_text": text, "main_metric": base["main_metric"], "metrics": base["metrics"], "budget": args.budget,
        "hardware": base.get("hardware") or hardware_fingerprint(), "run": str(out),
        **({"supernet": pretraining(Path(args.supernet))} if variant == "supernet" else {}),
        **({"unlabeled_file": str(args.unlabeled_file)} if variant == "unlabeled" else {}),
    }


def pretraining(supernet: Path) -> dict:
    """What the corpus-pre-trained super-net of a supernet row learned from, and its cost (its supernet.json)."""
    facts = json.loads((supernet / "supernet.json").read_text())
    keep = ("teacher", "corpus", "lines", "blocks", "max_length", "steps", "batch_size", "lr", "seed", "seconds",
            "held_out")
    return {"folder": str(supernet), **{k: facts.get(k) for k in keep}}


def by_variant(records: list[dict]) -> dict[tuple[str, str, str], list[dict]]:
    """The records of each (task, method, variant): one per seed."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["task"], r["method"], r["variant"]), []).append(r)
    return groups


def four_x_cell(rs: list[dict]) -> str:
    """The 4× point of each seed's run: its model, mean speed-up | mean ± std retention (and how many seeds had one
    measured at FOUR_X_SPEEDUP or more, where not all did)."""
    best = [r["four_x"] for r in rs if r.get("four_x")]
    if not best:
        return f"none at {FOUR_X_SPEEDUP}× | —"
    names = "/".join(dict.fromkeys(b["model"] for b in best))
    some = f" ({len(best)} of {len(rs)} seeds)" if len(best) < len(rs) else ""
    return (f"{names} {statistics.mean(b['speedup'] for b in best):.2f}×{some} | "
            f"{mean_std([100 * b['retention'] for b in best], 1)} %")


def best_lines(records: list[dict]) -> list[str]:
    """Issue 39's acceptance: per task, the student and variant whose 4× point keeps the most on average over its
    seeds (every seed measured at FOUR_X_SPEEDUP or more, and as many seeds as SEEDS_ASKED), then the mean over the
    tasks and the lowest."""
    best: dict[str, tuple[float, str]] = {}
    for (task, method, variant), rs in by_variant(records).items():
        if all(r.get("four_x") for r in rs) and len(rs) >= SEEDS_ASKED.get(task, 1):
            kept = statistics.mean(r["four_x"]["retention"] for r in rs)
            if kept > best.get(task, (-1.0, ""))[0]:
                best[task] = (kept, f"{method} {variant}, {len(rs)} seed{'s' * (len(rs) > 1)}")
    if not best:
        return []
    mean, low = statistics.mean(k for k, _ in best.values()), min(k for k, _ in best.values())
    each = "; ".join(f"{task} {100 * k:.1f} % ({what})" for task, (k, what) in sorted(best.items()))
    missing = [t for t in TASKS if t not in best]
    each += f"; not measured: {', '.join(missing)}" if missing else ""
    return [f"The best 4× point per task: {each}. Mean {100 * mean:.1f} % over {len(best)} tasks (≥ 98 % asked: "
            f"{'met' if mean >= 0.98 else 'NOT met'}), lowest {100 * low:.1f} % (≥ 95 % asked: "
            f"{'met' if low >= 0.95 else 'NOT met'})."]


def table(records: list[dict]) -> str:
    """Markdown: mean ± std over seeds per task, method and variant."""
    groups = by_variant(records)
    lines = ["| task | method | variant | seeds | student | retention | latency speed-up | "
             f"4× point (≥ {FOUR_X_SPEEDUP}×) | "
             "its retention | student train time |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (task, method, variant), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], VARIANTS.index(kv[0][2]))):
        scores = [r["metrics"]["student"][r["main_metric"]] for r in rs]
        minutes = statistics.mean(r["train_seconds"] or 0 for r in rs) / 60
        n = f" (N = {rs[0]['augment']})" if rs[0]["augment"] else ""
        lines.append(f"| {task} | {method} | {variant}{n} | "
                     f"{len(rs)} | {mean_std(scores)} | {mean_std([100 * r['retention'] for r in rs], 1)} % | "
                     f"{statistics.mean(r['speedup'] for r in rs):.2f}× | {four_x_cell(rs)} | {minutes:.1f} min |")
    if records:
        hw = records[0]["hardware"]
        lines += ["", measured_on(hw) + f"; teacher {records[0]['teacher']}, {records[0]['budget']} budget.",
                  "", *best_lines(records)]
    return "\n".join(lines)


def main(argv=None) -> None:
    from distillery.cli import setup_logging
    from distillery.pipeline import build_run_config, compress

    args = parse_args(argv)
    setup_logging()
    results = Path(args.results)
    for task, method, variant, seed in runs(args):
        out = Path(args.runs_dir) / f"augment-{task}-{method}-{variant}-s{seed}-{args.budget}"
        if not (args.reuse and (out / "report.md").is_file()):
            compress(build_run_config(method=CANDIDATES[method][0], task=task, budget=args.budget, teacher=args.teacher,
                                      data_dir=args.data_dir, out=str(out), overrides=overrides(method, variant, seed, args)),
                     overwrite=True)
        key = lambda r: (r["task"], r["method"], r["variant"], r["seed"], r["budget"])  # noqa: E731
        upsert_record(results, record(out, task, method, variant, seed, args), key)
        if not args.no_docs:
            replace_block(RESULTS_DOC, "augment", table(json.loads(results.read_text())))
        print(f"{task} {method} {variant} seed {seed}: recorded in {results}")


if __name__ == "__main__":
    main()
