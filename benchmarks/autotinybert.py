"""AutoTinyBERT on this machine: the latency predictor, and searched against conventional architectures.

    python benchmarks/autotinybert.py --only predictor                 # time K architectures, fit, held-out MAPE
    python benchmarks/autotinybert.py --only main --data-dir ../shared/data --speedups 2 4

predictor  K architectures sampled from the MiniLM super-net (head-dims), each extracted and timed at 1×128
           as a standalone model; the MLP predictor and the FLOP-count baseline fitted on part of them and
           scored on the held-out rest → results/autotinybert-latency.json and the README's block.
main       per speed-up and task: ``distillery compress --method autotinybert --speedup S`` (search) and the
           conventional rule at the same budget (``--option arch=conventional``), trained identically →
           results/autotinybert-<budget>.json and the README's results table.
"""

from __future__ import annotations

import json
import random
import time

from common import RESULTS, replace_readme_block, run_tasks, task_parser

from distillery.cli import setup_logging


def run_predictor(args) -> None:
    from transformers import AutoModel

    from distillery.autotinybert.latency import fit_predictor, measure
    from distillery.autotinybert.supernet import SuperNet
    from distillery.bench import hardware_fingerprint, latency_ms
    from distillery.teacher import resolve_teacher

    teacher = AutoModel.from_pretrained(resolve_teacher("minilm")).eval()
    supernet = SuperNet.from_teacher(teacher, "head-dims")
    archs = supernet.space.sample_distinct(args.archs, random.Random(args.seed))
    started = time.time()
    teacher_ms = latency_ms({"teacher": teacher}, runs=args.runs)["teacher"]
    ms = measure(supernet, archs, runs=args.runs)
    _, report = fit_predictor(supernet.space, archs, ms, test_fraction=args.test_fraction, seed=args.seed)
    record = {"hardware": hardware_fingerprint(), "teacher_ms": teacher_ms, "runs_per_architecture": args.runs,
              "seconds": time.time() - started, **report,
              "measurements": [{**a.as_dict(), "ms": m} for a, m in zip(archs, ms)]}
    (RESULTS / "autotinybert-latency.json").write_text(json.dumps(record, indent=2))
    print(json.dumps({k: v for k, v in record.items() if k != "measurements"}, indent=2))
    write_readme_block()


def readme_block() -> str:
    path = RESULTS / "autotinybert-latency.json"
    if not path.is_file():
        return ""
    r = json.loads(path.read_text())
    spread = [m["ms"] for m in r["measurements"]]
    return (f"**Latency predictor** ({r['measured']} architectures of the MiniLM super-net timed here as standalone "
            f"models at 1×128, {min(spread):.1f}–{max(spread):.1f} ms; teacher {r['teacher_ms']:.1f} ms): held-out MAPE on "
            f"{r['test']} unseen architectures **{r['mape_mlp']:.1f} %** for the MLP predictor, {r['mape_flops']:.1f} % "
            f"for the FLOP-count baseline ({r['seconds'] / 60:.1f} min to measure and fit).\n")


def write_readme_block() -> None:
    replace_readme_block("autotinybert", readme_block())


def main() -> None:
    parser = task_parser(__doc__, ["sst2", "mrpc", "rte"], "autotinybert")
    parser.add_argument("--only", nargs="+", choices=["predictor", "main"], default=["predictor", "main"])
    parser.add_argument("--speedups", nargs="+", type=float, default=[2.0, 4.0])
    parser.add_argument("--archs", type=int, default=150)
    parser.add_argument("--test-fraction", type=float, default=0.4)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    setup_logging()
    RESULTS.mkdir(parents=True, exist_ok=True)
    if "predictor" in args.only:
        run_predictor(args)
    if "main" in args.only:
        base = list(args.option)
        for speedup in args.speedups:
            for arch in ("search", "conventional"):
                args.option = base + [f"speedup={speedup:g}"] + ([f"arch={arch}"] if arch != "search" else [])
                run_tasks("autotinybert", args)


if __name__ == "__main__":
    main()
