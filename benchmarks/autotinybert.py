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


DISTILL_SPEEDUP = 2  # distill's student (teacher layers 0,2,4 at full width) is about 2×: compared at that budget
DISTILL_EXAMPLES = "all"  # the searched students' default train_examples: distill trains on the same


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
            f"models at 1×128 beside the teacher, {r['runs_per_architecture']} runs each, {min(spread):.1f}–{max(spread):.1f} ms; "
            f"teacher {r['teacher_ms']:.1f} ms; {r['hardware']['cpu']}, {r['hardware']['threads']} threads): held-out MAPE on "
            f"{r['test']} unseen architectures **{r['mape_mlp']:.1f} %** for the MLP predictor, {r['mape_flops']:.1f} % "
            f"for the FLOP-count baseline ({r['seconds'] / 60:.1f} min to measure and fit).\n")


def comparison_lines(budget: str = "quick") -> list[str]:
    """Searched against conventional and against the ``distill`` student at each speed-up: a table row
    per task (shape, measured speed-up, dev score, training time) and the means over the tasks."""
    def arch(rec: dict) -> str:  # from the run's note "Architecture: l=6 d_m=352 d_f=128 h=12 d_qkv=192; ..."
        found = [re.findall(r"=(\d+)", n.split(";")[0]) for n in rec.get("notes", []) if n.startswith("Architecture")]
        return ",".join(found[0]) if found else "?"

    score = lambda r: r["metrics"]["student"][r["main_metric"]]  # noqa: E731
    cell = lambda r, shape=True: (f"{arch(r) + ': ' if shape else ''}**{score(r):.3f}**, {r['speedup']['latency']:.2f}×, "  # noqa: E731
                                  f"{r['train_seconds'] / 60:.1f} min")
    def records(name: str) -> list[dict]:
        path = RESULTS / f"{name}.json"
        return json.loads(path.read_text()) if path.is_file() else []

    def whole_split(rec: dict) -> bool:  # the run distilled on more examples than the budget's (its note says)
        return any(n.startswith("Student data: all") for n in rec.get("notes", []))

    # distill trained on the searched students' examples: its train_examples=all run, or where the budget
    # held the whole train split already (MRPC, RTE, STS-B under 20k), the budget's run — the same examples
    distill = {r["task"]: r for r in records(f"distill-{budget}")}
    distill.update({r["task"]: r for r in records(f"distill-{DISTILL_EXAMPLES}-{budget}")})
    seeds = [r for r in records("autotinybert-seeds") if r["budget"] == budget]
    seed_notes = []

    def mean_over_seeds(rec: dict, task: str, row: str) -> tuple[float, list[float]]:
        extra = sorted((r for r in seeds if r["task"] == task and r["row"] == row), key=lambda r: r["seed"])
        values = [score(rec)] + [score(r) for r in extra]
        return sum(values) / len(values), values

    rows, means = [], []
    searched_files = [p for p in RESULTS.glob(f"autotinybert-*-{budget}.json") if len(p.stem.split("-")) == 3]
    for path in sorted(searched_files, key=lambda p: float(p.stem.split("-")[1])):  # autotinybert-<speed-up>-<budget>
        speedup = path.stem.split("-")[1]
        conv_path = RESULTS / f"autotinybert-{speedup}-conventional-{budget}.json"
        searched = {r["task"]: r for r in json.loads(path.read_text())}
        conv = {r["task"]: r for r in json.loads(conv_path.read_text())} if conv_path.is_file() else {}
        gaps = {"conventional": [], "distill": []}
        for t in sorted(searched):
            s = searched[t]
            others = []
            # distill's student is one shape (layers 0,2,4 at full width, about 2×): compared at that budget
            for name, table in (("conventional", conv), ("distill", distill if float(speedup) == DISTILL_SPEEDUP else {})):
                other = table.get(t)
                if other is None or (name == "distill" and whole_split(s) and not whole_split(other)):
                    others.append("—")  # no row, or distill on fewer examples than the searched student
                    continue
                gap = 100 * (score(s) - score(other))
                text = f"{cell(other, name == 'conventional')} ({gap:+.1f})"
                if name == "distill" and {r["row"] for r in seeds if r["task"] == t} == {"search", "distill"}:
                    (mine, mine_all), (theirs, theirs_all) = mean_over_seeds(s, t, "search"), mean_over_seeds(other, t, "distill")
                    gap = 100 * (mine - theirs)
                    text += f"; mean of {len(theirs_all)} seeds: searched {mine:.3f}, distill **{theirs:.3f}** (**{gap:+.1f}**)"
                    seed_notes.append(f"{t}: searched {', '.join(f'{v:.3f}' for v in mine_all)}; distill "
                                      f"{', '.join(f'{v:.3f}' for v in theirs_all)}")
                gaps[name].append(gap)
                others.append(text)
            rows.append(f"| {speedup}× | {t} ({s['main_metric']}) | {cell(s)} | " + " | ".join(others) + " |")
        for name, values in gaps.items():
            if values:
                mean = sum(values) / len(values)
                means.append(f"{speedup}×: searched {'+' if mean >= 0 else '−'}{abs(mean):.1f} points against "
                             f"{name} on the mean of {len(values)} task(s)")
    if not rows:
        return []
    head = ("| budget | task | searched l,d_m,d_f,h,d_qkv: dev, speed-up 1×128, training time | conventional (d_f = 4·d_m, "
            "d_qkv = d_m) at the searched one's measured latency (searched − it, points) | `distill` student, layers "
            "0,2,4, on the same examples (searched − it) |\n|---|---|---|---|---|")
    return [head + "\n" + "\n".join(rows) + "\n", "Mean: " + "; ".join(means) + ". Speed-ups are each run's own "
            "teacher ÷ student latency at 1×128. Training time is the student's (super-net, latency predictor, search, "
            "further training; the fine-tuned teacher is cached), quick budget: one super-net per task (300 one-shot "
            "steps, trained by the first run, or earlier when every row loads it with `--supernets`: then the times leave "
            "out its 2–6 min), further training as `distill` trains (2 epochs, here on the whole train split labelled "
            "by the teacher, fine-tuned on ≤ 20k: `train_examples=all`, as `distill` in its column) at the student "
            "learning rate × (speed-up − 1) within 1–3×."
            + (" Student seeds (`--only seeds`: 42, the table's run, then the others; search and further training "
               "repeated, the same teacher and super-net), where a dev set is too small for one run to order two "
               "students a point apart — the means are compared: " + "; ".join(seed_notes) + "." if seed_notes else "")
            + "\n"]


def ranking_line() -> str:
    path = RESULTS / "autotinybert-ranking.json"
    if not path.is_file():
        return ""
    r = json.loads(path.read_text())
    others = "; ".join(f"{k} {v['pairwise_accuracy']:.2f} (τ {v['kendall_tau']:.2f})" for k, v in r.get("variants", {}).items()
                       if k != r.get("evaluator"))
    hidden = {row["hidden"] for row in r["rows"]}
    space = f" of the searched space (d_m = {hidden.pop()})" if len(hidden) == 1 else ""
    return (f"**Super-net ranking** ({r['task']}, {r['architectures']} sampled architectures{space}, the search's score "
            f"({r.get('evaluator', 'proxy')}) of each as inherited from the super-net against its stand-alone dev accuracy "
            f"after {r['further_training_steps']} further-training steps): pairwise accuracy "
            f"**{r['pairwise_accuracy']:.2f}** (Eq. 5), Kendall τ {r['kendall_tau']:.2f}"
            + (f"; {r['pairwise_accuracy_pairs_over_1_point']:.2f} on the {r['pairs_over_1_point']} pairs whose dev accuracies "
               f"differ by more than a point (872 dev examples cannot order closer ones)" if "pairs_over_1_point" in r else "")
            + (f". Other scores of the same sub-networks: {others}" if others else "") + ".\n")


def write_docs_block() -> None:
    replace_block(DOCS / "autotinybert.md", "autotinybert", "\n".join([predictor_block(), *comparison_lines(), ranking_line()]).strip() + "\n")


def compared_pairs(b: list[float], margin: float = 0.0) -> list[tuple[int, int]]:
    """Index pairs of ``b``: all of them, or with ``margin`` those whose values differ by more than it."""
    return [(i, j) for i in range(len(b)) for j in range(i + 1, len(b)) if abs(b[i] - b[j]) > margin or not margin]


def pairwise_accuracy(a: list[float], b: list[float], margin: float = 0.0) -> float:
    """The paper's Eq. 5: the fraction of architecture pairs that both scores order the same way; with
    ``margin``, of the pairs whose ``b`` differ by more than it (pairs a noisy dev score cannot order)."""
    pairs = compared_pairs(b, margin)
    return sum((a[i] - a[j]) * (b[i] - b[j]) > 0 for i, j in pairs) / max(1, len(pairs))


def run_ranking(args) -> None:
    """Super-net ranking quality on SST-2: K architectures sampled from the task's super-net, each scored
    as the search scores it (the linear probe by default; the KD proxy and its terms beside it) and
    trained stand-alone (extracted, further trained ``--ranking-steps`` steps with the method's loss,
    dev accuracy)."""
    from scipy.stats import kendalltau

    from distillery.autotinybert.oneshot import load_projection, load_supernet
    from distillery.autotinybert.options import AutoTinyBertOptions
    from distillery.config import RunConfig
    from distillery.autotinybert.recipe import probe_evaluator, proxy_evaluator, search_space
    from distillery.data.encode import prepare_task_data
    from distillery.pipeline import build_run_config, compress
    from distillery.teacher import teacher_tokenizer

    task, budget = "sst2", args.budget
    # the super-net the 2× run trained, or the one it loaded (--supernets)
    run = Path(f"{args.runs_dir}/bench-{task}-autotinybert-2-{budget}")
    folder = str(run / "supernet") if (run / "supernet").is_dir() else \
        RunConfig.load(run / "config.yaml").method_options["supernet"]
    supernet, projection = load_supernet(folder).eval(), load_projection(folder)
    # the architectures the search would explore (the default options' space)
    archs = search_space(supernet.space, AutoTinyBertOptions.read({})).sample_distinct(args.ranking_archs,
                                                                                       random.Random(args.seed + 1))
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
    from distillery.data.tasks import get_task
    from distillery.runtime import load_model

    config = RunConfig.load(Path(rows[0]["run"]) / "config.yaml")
    teacher = load_model(json.loads((Path(rows[0]["run"]) / "train.json").read_text())["teacher_path"]).eval()
    task_data = prepare_task_data(get_task(task), teacher_tokenizer(config.teacher.name), config.data)
    opts = AutoTinyBertOptions.read(config.method_options)
    seed = config.student.seed
    probe = probe_evaluator(supernet, task_data, opts.probe_examples, opts.proxy_examples, seed)
    kd = proxy_evaluator(supernet, teacher, projection, task_data, opts.proxy_examples, seed,
                         opts.prediction_weight, opts.temperature, terms=True)
    for row, arch in zip(rows, archs):
        terms = kd(arch)
        row.update({"probe": probe(arch), "proxy": -terms.total(prediction_weight=opts.prediction_weight),
                    **{f"kd_{k}": v for k, v in terms._asdict().items()}})
    trained = [r["trained"] for r in rows]
    # what the search ranks by (evaluator=probe, the default) and the alternatives (evaluator=proxy, its terms)
    variants = {"probe": [r["probe"] for r in rows], "proxy": [r["proxy"] for r in rows],
                "prediction KD alone": [-r["kd_prediction"] for r in rows],
                "hidden + attention KD (the paper's)": [-(r["kd_hidden"] + r["kd_attention"]) for r in rows]}
    scores = variants[opts.evaluator]
    record = {"task": task, "architectures": len(rows), "pairwise_accuracy": pairwise_accuracy(scores, trained),
              "kendall_tau": float(kendalltau(scores, trained).statistic), "further_training_steps": args.ranking_steps,
              "evaluator": opts.evaluator,
              "probe": f"logistic regression (C = 0.1) on the [CLS] state, fitted on {opts.probe_examples} train examples, "
                       f"held-out log-likelihood on {opts.proxy_examples} others",
              "proxy": f"−(hidden + attention + {opts.prediction_weight:g} · prediction KD) on {opts.proxy_examples} "
                       f"held-out train examples",
              # SST-2 dev has 872 examples: two accuracies within a point are within its noise
              "pairwise_accuracy_pairs_over_1_point": pairwise_accuracy(scores, trained, 0.01),
              "pairs_over_1_point": len(compared_pairs(trained, 0.01)),
              "variants": {k: {"pairwise_accuracy": pairwise_accuracy(v, trained),
                               "kendall_tau": float(kendalltau(v, trained).statistic)} for k, v in variants.items()},
              "supernet": folder, "seconds": time.time() - started, "rows": rows}
    (RESULTS / "autotinybert-ranking.json").write_text(json.dumps(record, indent=2))
    print(json.dumps({k: v for k, v in record.items() if k != "rows"}, indent=2))
    write_docs_block()


def main() -> None:
    parser = task_parser(__doc__, ["sst2", "mrpc", "rte", "stsb"], "autotinybert")
    parser.add_argument("--only", nargs="+", choices=["predictor", "main", "ranking", "seeds"],
                        default=["predictor", "main", "ranking", "seeds"])
    parser.add_argument("--ranking-archs", type=int, default=8)
    parser.add_argument("--ranking-steps", type=int, default=300)
    parser.add_argument("--speedups", nargs="+", type=float, default=[2.0, 4.0])
    parser.add_argument("--supernet-speedup", type=float, default=2.0,
                        help="main: the searched run at this speed-up trains each task's super-net; the others load it")
    parser.add_argument("--supernets", default=None,
                        help="main: every row loads SUPERNETS/<task> (a super-net trained earlier) instead of training one")
    parser.add_argument("--rows", nargs="+", choices=["distill", "search", "conventional"],
                        default=["distill", "search", "conventional"],
                        help="main: the distill row (on the searched students' examples), the searched rows, the "
                             "conventional ones (at the searched one's latency)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[43, 44],
                        help="seeds: student seeds beside the main run's (42)")
    parser.add_argument("--seed-tasks", nargs="+", default=["rte", "mrpc"],
                        help="seeds: the tasks whose 2× comparison is averaged over seeds (small dev sets)")
    parser.add_argument("--archs", type=int, default=150)
    parser.add_argument("--test-fraction", type=float, default=0.4)
    # timings per architecture: 15 gave a held-out MAPE of 3.0 % on a quiet Xeon, 5.2 % on a noisier EPYC (30: 4.6 %)
    parser.add_argument("--runs", type=int, default=30)
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
    if "seeds" in args.only:
        run_seeds(args)
    write_docs_block()


def supernet_of(args, task: str) -> str:
    """The super-net folder every row of ``task`` but the first loads: ``--supernets``/<task>, or the one the
    searched run at ``--supernet-speedup`` trained."""
    if args.supernets:
        return f"{args.supernets}/{task}"
    return str(Path(args.runs_dir) / f"bench-{task}-autotinybert-{args.supernet_speedup:g}-{args.budget}/supernet")


def run_main(args) -> None:
    base = list(args.option)
    first = args.supernet_speedup
    runs = Path(args.runs_dir)
    if "distill" in args.rows:  # the comparison row, on the examples the searched students distil on
        args.option = [f"train_examples={DISTILL_EXAMPLES}"]
        run_tasks("distill", args)
    for speedup in args.speedups:
        for arch in (r for r in args.rows if r != "distill"):
            args.option = base + [f"speedup={speedup:g}"] + ([f"arch={arch}"] if arch != "search" else [])

            def shared(task, speedup=speedup, arch=arch) -> dict:
                # one super-net per task, trained by the searched run at --supernet-speedup: every row is
                # extracted from the same one-shot super-net and further trained identically
                out = {} if (speedup, arch) == (first, "search") and not args.supernets else {
                    "method_options.supernet": supernet_of(args, task)}
                if arch == "conventional":  # at the searched architecture's measured latency, not the budget,
                    # as a speed-up over the teacher: the machine's speed may have drifted since
                    searched = json.loads((runs / f"bench-{task}-autotinybert-{speedup:g}-{args.budget}/architecture.json").read_text())
                    out["method_options.speedup"] = searched["teacher_ms"] / searched["measured_ms"]
                return out

            run_tasks("autotinybert", args, shared)


def run_seeds(args) -> None:
    """The 2× comparison again with other student seeds on the tasks whose dev sets are small (RTE: 277
    examples, 0.36 points each; MRPC: 408): the searched run (search and further training, the same
    teacher and super-net) and the ``distill`` row, each per seed in ``--seeds`` → results/autotinybert-seeds.json;
    the table then compares the two on their means over these seeds and the main run's."""
    from common import record_from_run, upsert_result

    from distillery.pipeline import build_run_config, compress

    for task in args.seed_tasks:
        for seed in args.seeds:
            for row, method, overrides in (
                    ("search", "autotinybert", {"method_options.speedup": DISTILL_SPEEDUP,
                                                "method_options.supernet": supernet_of(args, task)}),
                    ("distill", "distill", {"method_options.train_examples": DISTILL_EXAMPLES})):
                out = Path(args.runs_dir) / f"seeds-{task}-{row}-{args.budget}-s{seed}"
                if not (args.reuse and (out / "report.md").is_file()):
                    compress(build_run_config(method=method, task=task, budget=args.budget, data_dir=args.data_dir,
                                              out=str(out), overrides={**overrides, "student.seed": seed}), overwrite=True)
                rec = record_from_run(out, method, args.budget)
                rec.update(row=row, seed=seed)
                upsert_result("autotinybert-seeds", rec, key=lambda r: (r["budget"], r["task"], r["row"], r["seed"]))
                print(f"{task} {row} seed {seed}: {rec['metrics']['student'][rec['main_metric']]:.4f}", flush=True)


if __name__ == "__main__":
    main()
