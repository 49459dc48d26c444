"""`compress --method auto` (quick budget), recorded: on SST-2 at 2x the frontier of every candidate, the live
baselines and the chosen model, in docs/results.md (block "auto") with the run's plot; any other task or speed-up
(issue 53: RTE, MRPC and STS-B at 4x) goes to benchmarks/results/auto-TASK-Sx.json and one line a run in block
"auto-tasks" (what was chosen, what it keeps of the teacher, whether a planned int8 export reached the target).

    python benchmarks/auto.py --data-dir ../shared/data [--task sst2] [--speedup 2] [--time-budget 40m] [--out runs/auto-sst2-2x]
    python benchmarks/auto.py --record runs/auto-sst2-2x        # record a finished run without running it

The run itself is the CLI's: `distillery compress --method auto --speedup S --time-budget T --task sst2
--option train_examples=budget` (every student distils on the budget's 20k sentences; the whole 67k split would
not fit the time budget on 2 CPU cores). Writes benchmarks/results/auto-sst2.json and auto-sst2.png.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from common import RESULTS, RESULTS_DOC, replace_block


def frontier_table(summary: dict) -> str:
    main = summary["main_metric"]
    target = summary["target"]
    lines = [f"| point | {main} | latency 1×128 (ms) | speed-up over the teacher | meets {target['speedup']}× |",
             "|---|---|---|---|---|"]
    points = [p for c in summary["candidates"] for p in c.get("points", [])]
    for p in sorted(points, key=lambda p: -p["speedup"]):
        chosen = " **(chosen)**" if summary.get("chosen") and p["point"] == summary["chosen"]["point"] else ""
        lines.append(f"| `{p['point']}`{chosen} | {p['score']:.4f} | {p['latency_ms']:.2f} | {p['speedup']:.2f}× | "
                     f"{'yes' if p['meets_target'] else 'no'} |")
    for b in summary.get("baselines", []):
        if b["model"] != "teacher":
            lines.append(f"| *live baseline: {b['model']}* | {b['score']:.4f} | — | {b['speedup']:.2f}× | — |")
    for s in summary.get("skipped", []):
        lines.append(f"| *skipped: {s['name']}* | — | — | — | {s['reason']} |")
    lines += ["", summary.get("why", ""), "", "![auto on SST-2: every candidate, the frontier dashed](../benchmarks/results/auto-sst2.png)"]
    return "\n".join(lines)


def teacher_score(summary: dict) -> float | None:
    return next((b["score"] for b in summary.get("baselines", []) if b["model"] == "teacher"), None)


def task_line(summary: dict) -> str:
    """One auto run of block "auto-tasks": the chosen point and what it keeps of the teacher, and the int8 exports
    that reached the target."""
    target, chosen, teacher = summary["target"], summary.get("chosen"), teacher_score(summary)
    if not chosen or not teacher:
        return f"| {summary['task']} | {target['speedup']:g}× | — | none | — | — | — | — | — | — |"
    points = [p for c in summary["candidates"] for p in c.get("points", [])]
    int8 = ", ".join(f"`{p['point']}` ({p['speedup']:.2f}×)" for p in points if "int8" in p["point"] and p["meets_target"])
    trained = sum(c.get("status") == "trained" for c in summary["candidates"])
    return (f"| {summary['task']} | {target['speedup']:g}× | {teacher:.4f} | `{chosen['point']}` | {chosen['score']:.4f} | "
            f"{100 * chosen['score'] / teacher:.1f} % | {chosen['speedup']:.2f}× | {int8 or 'none'} | {trained} | "
            f"{summary['seconds'] / 60:.0f} min |")


def record_task(out: Path, summary: dict) -> None:
    name = f"auto-{summary['task']}-{summary['target']['speedup']:g}x"
    (RESULTS / f"{name}.json").write_text(json.dumps(summary, indent=2) + "\n")
    runs = [json.loads(f.read_text()) for f in sorted(RESULTS.glob("auto-*-*x.json"))]
    lines = ["| task | target | teacher | chosen | score | kept | measured speed-up | int8 exports that reach the "
             "target | candidates trained | run |", "|---|---|---|---|---|---|---|---|---|---|"]
    replace_block(RESULTS_DOC, "auto-tasks", "\n".join(lines + [task_line(r) for r in runs]))
    print(f"{out}: {task_line(summary)}")


def record(out: Path) -> None:
    summary = json.loads((out / "auto.json").read_text())
    if (summary["task"], float(summary["target"]["speedup"] or 0)) != ("sst2", 2.0):
        return record_task(out, summary)
    (RESULTS / "auto-sst2.json").write_text(json.dumps(summary, indent=2) + "\n")
    shutil.copyfile(out / "plot.png", RESULTS / "auto-sst2.png")
    replace_block(RESULTS_DOC, "auto", frontier_table(summary))
    print(frontier_table(summary))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--speedup", default="2")
    parser.add_argument("--time-budget", default="40m")
    parser.add_argument("--out", default="runs/auto-sst2-2x")
    parser.add_argument("--record", default=None, help="A finished auto run folder: record it, run nothing.")
    args = parser.parse_args()
    if args.record:
        return record(Path(args.record))
    subprocess.run([sys.executable, "-m", "distillery.cli", "compress", "--method", "auto", "--speedup", args.speedup,
                    "--time-budget", args.time_budget, "--task", args.task, "--data-dir", args.data_dir,
                    "--option", "train_examples=budget", "--out", args.out], check=True)
    record(Path(args.out))


if __name__ == "__main__":
    main()
