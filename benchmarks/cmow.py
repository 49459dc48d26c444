"""CMOW/CBOW-Hybrid students against their teacher, measured here.

    python benchmarks/cmow.py --data-dir ../shared/data                  # the five GLUE tasks (quick budget)
    python benchmarks/cmow.py --tasks sst2 --rebench                     # re-measure finished runs (quiet machine)
    python benchmarks/cmow.py --tasks mrpc --option pair_mode=joint      # a variant's own runs and rows

main    ``distillery compress --method cmow`` (bidirectional hybrid, d = 20, d_vec = 400, MLP head, DiffCat
        for pairs, task-specific distillation from random init) per task into
        runs/bench-<task>-cmow-<budget>/ → benchmarks/results/cmow-<budget>.json and the README's results
        table (throughput at 256×64 and latency at 1×128, student and teacher in one process).
"""

from __future__ import annotations

import argparse

from common import RESULTS, run_tasks

from distillery.cli import setup_logging


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--tasks", nargs="+", default=["sst2", "mrpc", "stsb", "cola", "rte"])
    parser.add_argument("--budget", default="quick", choices=["quick", "full"])
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--reuse", action="store_true", help="Use finished run folders as they are.")
    parser.add_argument("--rebench", action="store_true", help="Measure finished runs again, do not train.")
    parser.add_argument("--option", nargs="+", default=[], metavar="KEY=VALUE", help="cmow options of a variant.")
    args = parser.parse_args()
    setup_logging()
    RESULTS.mkdir(parents=True, exist_ok=True)
    run_tasks("cmow", args)


if __name__ == "__main__":
    main()
