"""AutoTinyBERT on this machine: the latency predictor, and searched against conventional architectures.

    python benchmarks/autotinybert.py --only predictor                 # time K architectures, fit, held-out MAPE
    python benchmarks/autotinybert.py --only main --data-dir ../shared/data --speedups 2 4

predictor  K architectures sampled from the MiniLM super-net (head-dims), each extracted and timed at 1×128
           as a standalone model beside the teacher (in teacher-time units, as the recipe times them); the MLP
           predictor and the FLOP-count baseline fitted on part of them and scored on the held-out rest →
           results/autotinybert-latency.json and the block in docs/autotinybert.md.
main       per speed-up and task: ``distillery compress --method autotinybert --speedup S`` (search) and the
           conventional rule at the searched model's measured speed-up (``--option arch=conventional``), all from the one super-net
           the first run of the task trained (``--option supernet=...``), trained identically →
           results/autotinybert-<budget>.json and the results tables (docs/results.md, README.md's summary).
"""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

from common import DOCS, RESULTS, replace_block, run_tasks, task_parser

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
    teacher_ms = latency_ms({"teacher": teacher}, runs=3 * args.runs)["teacher"]
    ms = measure(supernet, archs, runs=args.runs, reference=teacher, reference_ms=teacher_ms)  # as the recipe does
    _, report = fit_predictor(supernet.space, archs, ms, test_fraction=args.test_fraction, seed=args.seed)
    record = {"hardware": hardware_fingerprint(), "teacher_ms": teacher_ms, "runs_per_architecture": args.runs,
              "seconds": time.time() - started, **report,
              "measurements": [{**a.as_dict(), "ms": m} for a, m in zip(archs, ms)]}
    (RESULTS / "autotinybert-latency.json").write_text(json.dumps(record, indent=2))
    print(json.dumps({k: v for k, v in record.items() if k != "measurements"}, indent=2))
    write_docs_block()


def predictor_block() -> str:
    path = RESULTS / "autotinybert-latency.json"
    if not path.is_file():
        return ""
    r = json.loads(path.read_text())
    spread = [m["ms"] for m in r["measurements"]]
    return (f"**Latency predictor** ({r['measured']} architectures of the MiniLM super-net timed here as standalone "
            f"models at 1×128 beside the teacher, {min(spread):.1f}–{max(spread):.1f} ms; teacher {r['teacher_ms']:.1f} ms): held-out MAPE on "
            f"{r['test']} unseen architectures **{r['mape_mlp']:.1f} %** for the MLP predictor, {r['mape_flops']:.1f} % "
            f"for the FLOP-count baseline ({r['seconds'] / 60:.1f} min to measure and fit).\n")


def comparison_lines(budget: str = "quick") -> list[str]:
    """Searched against conventional at each speed-up: a table row per task (shape, measured latency,
    dev score, training time) and the mean over the tasks both have."""
    def arch(rec: dict) -> str:  # from the run's note "Architecture: l=6 d_m=352 d_f=128 h=12 d_qkv=192; ..."
        found = [re.findall(r"=(\d+)", n.split(";")[0]) for n in rec.get("notes", []) if n.startswith("Architecture")]
        return ",".join(found[0]) if found else "?"

    def ms(rec: dict) -> float:
        return rec["models"]["student"]["latency_ms"]["median"]

    score = lambda r: r["metrics"]["student"][r["main_metric"]]  # noqa: E731
    rows, means = [], []
    searched_files = [p for p in RESULTS.glob(f"autotinybert-*-{budget}.json") if len(p.stem.split("-")) == 3]
    for path in sorted(searched_files, key=lambda p: float(p.stem.split("-")[1])):  # autotinybert-<speed-up>-<budget>
        parts = path.stem.split("-")
        conv_path = RESULTS / f"autotinybert-{parts[1]}-conventional-{budget}.json"
        if not conv_path.is_file():
            continue
        searched = {r["task"]: r for r in json.loads(path.read_text())}
        conv = {r["task"]: r for r in json.loads(conv_path.read_text())}
        tasks = sorted(set(searched) & set(conv))
        for t in tasks:
            s, c = searched[t], conv[t]
            rows.append(f"| {parts[1]}× | {t} ({s['main_metric']}) | {arch(s)}: **{score(s):.3f}**, {ms(s):.1f} ms "
                        f"({s['speedup']['latency']:.2f}×), {s['train_seconds'] / 60:.1f} min | {arch(c)}: **{score(c):.3f}**, "
                        f"{ms(c):.1f} ms ({c['speedup']['latency']:.2f}×), {c['train_seconds'] / 60:.1f} min | "
                        f"{100 * (score(s) - score(c)):+.1f} |")
        if tasks:
            diff = 100 * sum(score(searched[t]) - score(conv[t]) for t in tasks) / len(tasks)
            means.append(f"{parts[1]}×: searched {'+' if diff >= 0 else '−'}{abs(diff):.1f} points on the mean of "
                         f"{len(tasks)} task(s)")
    if not rows:
        return []
    head = ("| budget | task | searched l,d_m,d_f,h,d_qkv: dev, latency 1×128, training time | conventional (d_f = 4·d_m, "
            "d_qkv = d_m) at the searched one's measured latency | searched − conventional (points) |\n|---|---|---|---|---|")
    return [head + "\n" + "\n".join(rows) + "\n", "Mean: " + "; ".join(means) + ". Training time is the student's "
            "(super-net, latency predictor, search, further training; the fine-tuned teacher is cached), quick budget: "
            "one super-net per task (300 one-shot steps, the first run), 2 epochs of further training on ≤ 20k examples.\n"]


def ranking_line() -> str:
    path = RESULTS / "autotinybert-ranking.json"
    if not path.is_file():
        return ""
    r = json.loads(path.read_text())
    return (f"**Super-net ranking** ({r['task']}, {r['architectures']} sampled architectures, proxy score against "
            f"stand-alone dev accuracy after {r['further_training_steps']} further-training steps): pairwise accuracy "
            f"**{r['pairwise_accuracy']:.2f}** (Eq. 5), Kendall τ {r['kendall_tau']:.2f}.\n")


def write_docs_block() -> None:
    replace_block(DOCS / "autotinybert.md", "autotinybert", "\n".join([predictor_block(), *comparison_lines(), ranking_line()]).strip() + "\n")


def pairwise_accuracy(a: list[float], b: list[float]) -> float:
    """The paper's Eq. 5: the fraction of architecture pairs that both scores order the same way."""
    pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
    return sum((a[i] - a[j]) * (b[i] - b[j]) > 0 for i, j in pairs) / len(pairs)


def run_ranking(args) -> None:
    """Super-net ranking quality on SST-2: K architectures sampled from the task's super-net, each scored
    by the search's proxy (−KD loss in the super-net, held-out train examples) and trained stand-alone
    (extracted, further trained ``--ranking-steps`` steps with the method's loss, dev accuracy)."""
    from scipy.stats import kendalltau

    from distillery.autotinybert.oneshot import load_projection, load_supernet
    from distillery.autotinybert.recipe import proxy_evaluator
    from distillery.data.encode import prepare_task_data
    from distillery.pipeline import build_run_config, compress
    from distillery.teacher import teacher_tokenizer

    task, budget = "sst2", args.budget
    folder = f"{args.runs_dir}/bench-{task}-autotinybert-2-{budget}/supernet"
    supernet, projection = load_supernet(folder).eval(), load_projection(folder)
    archs = supernet.space.sample_distinct(args.ranking_archs, random.Random(args.seed + 1))
    started = time.time()
    rows = []
    for k, arch in enumerate(archs):
        name = "x".join(str(v) for v in arch.as_dict().values())
        out = f"{args.runs_dir}/ranking-{task}-{name}"
        if not (args.reuse and (Path(out) / "metrics.json").is_file()):
            config = build_run_config(method="autotinybert", task=task, budget=budget, data_dir=args.data_dir, out=out,
                                      overrides={"method_options.supernet": folder,
                                                 "method_options.arch": ",".join(str(v) for v in arch.as_dict().values()),
                                                 "student.max_steps": args.ranking_steps, "bench.latency_runs": 5,
                                                 "bench.throughput_runs": 1})
            compress(config, overwrite=True)
        metrics = json.loads((Path(out) / "metrics.json").read_text())
        rows.append({**arch.as_dict(), "trained": metrics["student"]["accuracy"], "run": out})
        print(f"[{k + 1}/{len(archs)}] {arch}: dev accuracy {rows[-1]['trained']:.4f}", flush=True)
    # the proxy reads the fine-tuned teacher the runs used (train.json) and the runs' encoded train split
    from distillery.config import RunConfig
    from distillery.data.tasks import get_task
    from distillery.runtime import load_model

    config = RunConfig.load(Path(rows[0]["run"]) / "config.yaml")
    teacher = load_model(json.loads((Path(rows[0]["run"]) / "train.json").read_text())["teacher_path"]).eval()
    task_data = prepare_task_data(get_task(task), teacher_tokenizer(config.teacher.name), config.data)
    evaluate = proxy_evaluator(supernet, teacher, projection, task_data, 256, config.student.seed)
    for row, arch in zip(rows, archs):
        row["proxy"] = evaluate(arch)
    proxy, trained = [r["proxy"] for r in rows], [r["trained"] for r in rows]
    record = {"task": task, "architectures": len(rows), "pairwise_accuracy": pairwise_accuracy(proxy, trained),
              "kendall_tau": float(kendalltau(proxy, trained).statistic), "further_training_steps": args.ranking_steps,
              "proxy": "−(hidden + attention KD loss) on 256 held-out train examples", "supernet": folder,
              "seconds": time.time() - started, "rows": rows}
    (RESULTS / "autotinybert-ranking.json").write_text(json.dumps(record, indent=2))
    print(json.dumps({k: v for k, v in record.items() if k != "rows"}, indent=2))
    write_docs_block()


def main() -> None:
    parser = task_parser(__doc__, ["sst2", "mrpc", "rte"], "autotinybert")
    parser.add_argument("--only", nargs="+", choices=["predictor", "main", "ranking"], default=["predictor", "main", "ranking"])
    parser.add_argument("--ranking-archs", type=int, default=8)
    parser.add_argument("--ranking-steps", type=int, default=300)
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
        run_main(args)
    if "ranking" in args.only:
        run_ranking(args)
    write_docs_block()


def run_main(args) -> None:
    base = list(args.option)
    first = args.speedups[0]
    runs = Path(args.runs_dir)
    for speedup in args.speedups:
        for arch in ("search", "conventional"):
            args.option = base + [f"speedup={speedup:g}"] + ([f"arch={arch}"] if arch != "search" else [])

            def shared(task, speedup=speedup, arch=arch) -> dict:
                # one super-net per task, trained by the first run: every row is extracted from the same
                # one-shot super-net and further trained identically
                out = {} if (speedup, arch) == (first, "search") else {
                    "method_options.supernet": str(runs / f"bench-{task}-autotinybert-{first:g}-{args.budget}/supernet")}
                if arch == "conventional":  # at the searched architecture's measured latency, not the budget,
                    # as a speed-up over the teacher: the machine's speed may have drifted since
                    searched = json.loads((runs / f"bench-{task}-autotinybert-{speedup:g}-{args.budget}/architecture.json").read_text())
                    out["method_options.speedup"] = searched["teacher_ms"] / searched["measured_ms"]
                return out

            run_tasks("autotinybert", args, shared)


if __name__ == "__main__":
    main()
