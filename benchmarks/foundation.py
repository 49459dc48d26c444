"""Teacher vs the layer-drop baseline student on GLUE tasks, measured in one process per task.

    python benchmarks/foundation.py --data-dir ../shared/data [--tasks sst2 mrpc stsb cola rte] [--budget quick]

Each task runs ``distillery compress --method distill --option train_examples=budget`` (the student on the
budget's examples, as the teacher) into runs/bench-<task>-distill-<budget>/,
then its record goes to benchmarks/results/distill-<budget>.json, the full results table in
docs/results.md and the README's SST-2 summary.
``--rebench`` measures finished runs again without training (run it once on a quiet machine: the
published latencies come from that pass).
"""

from __future__ import annotations

from pathlib import Path

from common import load_all_results, rebench, record_from_run, save_results, task_parser, update_results_tables

from distillery.cli import setup_logging
from distillery.pipeline import build_run_config, compress


def main() -> None:
    parser = task_parser(__doc__, ["sst2", "mrpc", "stsb", "cola", "rte"], "distill", variants=False)
    args = parser.parse_args()
    setup_logging()

    name = f"distill-{args.budget}"
    previous = [r for r in load_all_results() if r["method"] == "distill" and r["budget"] == args.budget]
    records = {r["task"]: r for r in previous}
    for task in args.tasks:
        out = Path(args.runs_dir) / f"bench-{task}-distill-{args.budget}"
        if args.rebench:
            rebench(out)
        elif not (args.reuse and (out / "report.md").is_file()):
            config = build_run_config(method="distill", task=task, budget=args.budget, data_dir=args.data_dir,
                                      out=str(out), overrides={"method_options.train_examples": "budget"})
            compress(config, overwrite=True)
        records[task] = record_from_run(out, "distill", args.budget)
        save_results(name, list(records.values()))
        update_results_tables(load_all_results())
        print(f"{task}: recorded in benchmarks/results/{name}.json")


if __name__ == "__main__":
    main()
