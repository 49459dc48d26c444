"""MoEBERT against its teacher: five GLUE tasks, the importance computation, the paper's ablations,
and the speed of each variant, all measured here.

    python benchmarks/moebert.py --data-dir ../shared/data                # everything below
    python benchmarks/moebert.py --data-dir ../shared/data --only main    # tasks only (or: importance, ablations, speed, latency)
    python benchmarks/moebert.py --rebench                                # re-measure finished task runs (quiet machine)
    python benchmarks/moebert.py --only main --tasks sst2 --option shared_mode=cloned   # a variant's own rows

main        ``distillery compress --method moebert`` (defaults: 4 experts × d_h/4, s = d_h/6, hash-r, tied,
            all layers distilled) per task into runs/bench-<task>-moebert-<budget>/ →
            benchmarks/results/moebert-<budget>.json and the results tables (docs/results.md, README.md's summary).
importance  Eq. 4 on the fine-tuned built-in teacher: the hook-based pass against the per-example
            ``torch.autograd.grad`` reference, same examples → results/moebert-importance.json.
ablations   the paper's ablations on one task (default SST-2), each a run with the same budget
            (``--ablation-steps`` optimizer steps, the cached quick teacher) → results/moebert-ablations.json
            and the MoEBERT block in docs/moebert.md, with a line per ablation on whether the paper's direction held.
speed       teacher, tied, cloned, hash-b and gate students (from the ablation runs) and the no-routing
            bound (the teacher with every FFN narrowed to d_e neurons) measured in one process, at 2
            and 1 threads → results/moebert-speed.json.
int8        the int8 export's gain over its fp32 model, at 1×128, of MoEBERT students of 2 and 4 experts beside the
            teacher's architecture's own (random weights of the built-in teacher's architecture: weights do not change
            the time), three repeats per ``--speed-threads`` count → results/moebert-int8.json: the share of the
            teacher's gain a MoEBERT export keeps, which ``--method auto`` plans by (distillery.moebert.auto.INT8_SHARE).
latency     the acceptance setting: the SST-2 task run's student beside its teacher only at 1×128, eight
            sets of 200 interleaved runs per thread count → results/moebert-latency.json.
seeds       the full quick SST-2 run repeated with student seeds ``--seeds`` (same cached teacher, same
            20k examples; the seed moves the data order, the hash tables and the importance sample),
            with ``--option`` method options and ``--set`` run settings → results/moebert-seeds.json:
            how far run-to-run spread moves the student-teacher gap.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from common import (DOCS, RESULTS, ROOT, record_from_run, replace_block, run_tasks, student_score, task_parser,
                    teacher_and_student, upsert_result)

from distillery.bench import benchmark, hardware_fingerprint
from distillery.cli import parse_options, setup_logging
from distillery.pipeline import build_run_config, compress

# name -> (method options, what the paper's figure/table is); "default" is the reference of every group
ABLATIONS = {
    "default": {},
    "split-random": {"split": "random"},
    "split-inverse": {"split": "inverse"},
    "shared-0": {"shared": 0},
    "shared-d_e": {"shared": "d_e"},
    "distill-last": {"distill_layers": "last"},
    "distill-skip": {"distill_layers": "skip"},
    "distill-none": {"distill_layers": "none"},
    "routing-hash-b": {"routing": "hash-b"},
    "routing-gate": {"routing": "gate"},
    "cloned": {"shared_mode": "cloned"},
}
GROUPS = [
    ("Adaptation split (Fig. 3a)", ["default", "split-random", "split-inverse"],
     "import > random > inverse", lambda s: s["default"] > s["split-random"] > s["split-inverse"]),
    ("Shared neurons s (Fig. 2c)", ["shared-0", "default", "shared-d_e"],
     "s = d_h/6 beats both s = 0 and s = d_e", lambda s: s["default"] > s["shared-0"] and s["default"] > s["shared-d_e"]),
    ("Distilled layers (Fig. 3b, Table 3)", ["default", "distill-skip", "distill-last", "distill-none"],
     "all ≈ skip > last, and no distillation is worst",
     lambda s: min(s["default"], s["distill-skip"]) > s["distill-last"] and s["distill-none"] < s["default"]),
    ("Routing (Fig. 3c)", ["default", "routing-hash-b", "routing-gate"],
     "all routings within 1 point of each other (MoEBERT is robust to routing)",
     lambda s: max(s[k] for k in ("default", "routing-hash-b", "routing-gate"))
     - min(s[k] for k in ("default", "routing-hash-b", "routing-gate")) <= 0.01),
    ("Shared neurons stored (ours)", ["default", "cloned"],
     "no paper claim: tied (one shared block) vs cloned (the paper's copies)", None),
]


def run_main(args) -> None:
    run_tasks("moebert", args, lambda task: {"data.squad_holdout": 0.2} if task.startswith("squad") else {})


def run_importance(args) -> None:
    """The hook-based importance against the per-example reference on the same real examples."""
    import torch

    from distillery.data.encode import prepare_task_data
    from distillery.data.loading import task_for
    from distillery.importance import ffn_importance
    from distillery.teacher import get_finetuned_teacher, teacher_tokenizer

    if str(ROOT) not in sys.path:  # the per-example reference is a test oracle: tests/oracles.py
        sys.path.insert(0, str(ROOT))
    from tests.oracles import reference_importance

    config = build_run_config(method="moebert", task="sst2", data_dir=args.data_dir)
    task = task_for(config.data)
    task_data = prepare_task_data(task, teacher_tokenizer("minilm"), config.data)
    teacher, _, _ = get_finetuned_teacher(config.teacher, task, config.data, task_data)
    subset = task_data.train.select(range(args.importance_examples))
    warm = task_data.train.select(range(args.importance_examples, args.importance_examples + 64))
    ffn_importance(teacher, warm, task_data.collate, "classification", progress=False)  # first-call costs out of the timing
    reference_importance(teacher, warm.select(range(4)), task_data.collate, "classification")
    fast_times, slow_times = [], []
    for _ in range(args.importance_repeats):  # taking turns, so that both see the same machine
        t0 = time.perf_counter()
        fast = ffn_importance(teacher, subset, task_data.collate, "classification", batch_size=32, progress=False)
        fast_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        slow = reference_importance(teacher, subset, task_data.collate, "classification")
        slow_times.append(time.perf_counter() - t0)
    fast_s, slow_s = statistics.median(fast_times), statistics.median(slow_times)
    rel = ((fast - slow).abs() / slow.abs().clamp_min(1e-12)).max().item()
    record = {"examples": len(subset), "teacher": "minilm fine-tuned on sst2 (quick)", "fast_seconds": fast_s,
              "reference_seconds": slow_s, "speedup": slow_s / fast_s, "fast_runs": fast_times, "reference_runs": slow_times,
              "max_abs_diff": (fast - slow).abs().max().item(), "max_rel_diff": rel,
              "max_score": slow.max().item(), "hardware": hardware_fingerprint(), "torch_threads": torch.get_num_threads()}
    (RESULTS / "moebert-importance.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))


ABLATION_LR = 5e-4


def ablation_out(args, name: str) -> Path:
    return Path(args.runs_dir) / f"ablation-{args.ablation_task}-moebert-{name}"


def run_ablations(args) -> None:
    from distillery.teacher import teacher_config

    d_h = teacher_config("minilm").intermediate_size
    names = args.ablations or list(ABLATIONS)
    for name in names:
        out = ablation_out(args, name)
        options = dict(ABLATIONS[name])
        if options.get("shared") == "d_e":
            options["shared"] = d_h // 4
        if not (args.reuse and (out / "report.md").is_file()):
            # The paper's conversion (no refit) at the rate it trains best with: the ablations test
            # the paper's claims, and our refit would change every variant's starting point.
            overrides = {"student.max_steps": args.ablation_steps, "student.eval_every": 100,
                         "bench.latency_runs": 10, "bench.throughput_runs": 1,
                         "student.lr": ABLATION_LR, "method_options.refit": False,
                         **{f"method_options.{k}": v for k, v in options.items()}}
            compress(build_run_config(method="moebert", task=args.ablation_task, budget="quick",
                                      data_dir=args.data_dir, out=str(out), overrides=overrides), overwrite=True)
        rec = record_from_run(out, "moebert", "quick")
        rec.update(ablation=name, options=options, max_steps=args.ablation_steps)
        upsert_result("moebert-ablations", rec, key=lambda r: r["ablation"])
        print(f"ablation {name}: {rec['metrics']['student'][rec['main_metric']]:.4f}")
    write_docs_block()


def run_seeds(args) -> None:
    options, settings = parse_options(args.option), parse_options(args.set)
    label = " ".join(f"{k}={v}" for k, v in {**options, **settings}.items()) or "default"
    suffix = "".join(f"-{v}" for v in [*options.values(), *settings.values()])
    for seed in args.seeds:
        out = Path(args.runs_dir) / f"seeds-sst2-moebert{suffix}-s{seed}"
        if not (args.reuse and (out / "report.md").is_file()):
            overrides = {"student.seed": seed, "bench.latency_runs": 10, "bench.throughput_runs": 1,
                         **{f"method_options.{k}": v for k, v in options.items()}, **settings}
            compress(build_run_config(method="moebert", task="sst2", budget="quick", data_dir=args.data_dir,
                                      out=str(out), overrides=overrides), overwrite=True)
        rec = record_from_run(out, "moebert", "quick")
        rec.update(variant=label, options=options, settings=settings, seed=seed)
        upsert_result("moebert-seeds", rec, key=lambda r: (r["variant"], r["seed"]))
        print(f"seed {seed} ({label}): student {student_score(rec):.4f}, teacher {rec['metrics']['teacher']['accuracy']:.4f}")
    write_docs_block()


def narrow_ffn(teacher, width: int):
    """A copy of ``teacher`` whose every FFN keeps its first ``width`` neurons: a dense model doing a
    token's MoE FLOPs (d_e neurons) with no routing at all. No router can beat it, so its speed-up
    is the bound the dispatch is measured against."""
    import copy

    import torch

    from distillery.moebert.convert import dense_ffns

    model = copy.deepcopy(teacher)
    for w1, w2 in dense_ffns(model):
        w1.weight, w1.bias = torch.nn.Parameter(w1.weight[:width].clone()), torch.nn.Parameter(w1.bias[:width].clone())
        w2.weight = torch.nn.Parameter(w2.weight[:, :width].clone())
        w1.out_features = w2.in_features = width
    model.config.intermediate_size = width
    return model.eval()


def run_speed(args) -> None:
    """Every storage/routing variant and the teacher measured together, in one process, with the
    dense model of the experts' width as the no-routing bound."""
    from distillery.runtime import load_model

    first = ablation_out(args, "default")
    train = json.loads((first / "train.json").read_text())
    models = {"teacher": load_model(train["teacher_path"])}
    for name in ("default", "cloned", "routing-hash-b", "routing-gate"):
        out = ablation_out(args, name)
        if (out / "student").is_dir():
            models[{"default": "hash-r tied"}.get(name, name)] = load_model(out / "student")
    d_e = models["hash-r tied"].config.expert_size
    models[f"dense FFN {d_e} (no-routing bound)"] = narrow_ffn(models["teacher"], d_e)
    # 2 threads (every core here) and 1: the fixed costs the experts do not shrink (attention's softmax,
    # LayerNorms, dispatch) parallelise worse than the matmuls, so the ratio depends on the thread count
    benches = [benchmark(models, latency_runs=args.latency_runs, threads=t) for t in args.speed_threads]
    (RESULTS / "moebert-speed.json").write_text(json.dumps(benches, indent=2))
    write_docs_block()


def run_int8(args) -> None:
    """How much of the int8 gain measured on the teacher's architecture a MoEBERT student's int8 export keeps."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from distillery.bench import torch_threads
    from distillery.config import BUILTIN_TEACHER
    from distillery.export import int8_speedup
    from distillery.moebert.convert import convert
    from distillery.teacher import teacher_config, teacher_tokenizer

    torch.manual_seed(0)
    config = teacher_config(BUILTIN_TEACHER)
    config.num_labels = 2
    tokenizer = teacher_tokenizer(BUILTIN_TEACHER)
    teacher = AutoModelForSequenceClassification.from_config(config).eval()
    students = {experts: convert(teacher, None, num_experts=experts, split="random").eval() for experts in (2, 4)}
    records = []
    for threads in args.speed_threads:
        for repeat in range(3):
            with torch_threads(threads):
                gain = {"teacher": int8_speedup(teacher, tokenizer, (1, 128), args.latency_runs)}
                gain.update({f"moebert-{e}": int8_speedup(m, tokenizer, (1, 128), args.latency_runs)
                             for e, m in students.items()})
            share = {name: (g - 1) / (gain["teacher"] - 1) for name, g in gain.items() if name != "teacher"}
            records.append({"threads": threads, "repeat": repeat, "int8_gain": gain, "share_of_teacher_gain": share})
            print(f"{threads} thread(s): int8 gain {', '.join(f'{k} {v:.2f}' for k, v in gain.items())}; share "
                  f"{', '.join(f'{k} {v:.2f}' for k, v in share.items())}", flush=True)
    (RESULTS / "moebert-int8.json").write_text(json.dumps(
        {"teacher": BUILTIN_TEACHER, "weights": "random", "shape": [1, 128], "runs": args.latency_runs,
         "hardware": hardware_fingerprint(), "records": records}, indent=2))


def run_latency(args) -> None:
    """The acceptance setting: the SST-2 task run's student beside its teacher only, at 1×128, in one
    process; ``--latency-repeats`` sets of ``--pair-runs`` interleaved runs per thread count, so that
    the spread between sets (this VM's speed drifts) is on record next to the median."""
    from distillery.bench import latency_ms

    run = Path(args.runs_dir) / f"bench-sst2-moebert-{args.budget}"
    models = teacher_and_student(run)
    records = []
    for threads in args.speed_threads:
        sets = [latency_ms(models, (1, 128), runs=args.pair_runs, warmup=10, threads=threads)
                for _ in range(args.latency_repeats)]
        ratios = [s["teacher"] / s["student"] for s in sets]
        records.append({"threads": threads, "runs": args.pair_runs, "teacher_ms": [s["teacher"] for s in sets],
                        "student_ms": [s["student"] for s in sets], "ratios": ratios,
                        "median_ratio": statistics.median(ratios)})
        print(f"{threads} thread(s): ratios {', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}")
    (RESULTS / "moebert-latency.json").write_text(json.dumps(
        {"run": str(run), "shape": [1, 128], "hardware": hardware_fingerprint(), "records": records}, indent=2))
    write_docs_block()


def docs_block() -> str:
    lines = []
    pair = RESULTS / "moebert-latency.json"
    if pair.is_file():
        p = json.loads(pair.read_text())
        sets = "; ".join(f"{r['threads']} thread(s): {min(r['ratios']):.3f}–{max(r['ratios']):.3f}, "
                         f"**median {r['median_ratio']:.2f}×** (teacher {statistics.median(r['teacher_ms']):.1f} ms)"
                         for r in p["records"])
        lines += [f"**Teacher beside the SST-2 student only** (1×128, hash-r tied, one process: the acceptance "
                  f"setting), {len(p['records'][0]['ratios'])} sets of {p['records'][0]['runs']} interleaved runs: "
                  f"{sets}.", ""]
    imp = RESULTS / "moebert-importance.json"
    if imp.is_file():
        r = json.loads(imp.read_text())
        lines += [f"**Importance (Eq. 4)** on {r['examples']} SST-2 training examples with the fine-tuned built-in teacher: "
                  f"hooks {r['fast_seconds']:.2f} s, per-example `torch.autograd.grad` reference {r['reference_seconds']:.1f} s "
                  f"(medians of {len(r['fast_runs'])} turns each; **{r['speedup']:.1f}× faster**), "
                  f"largest difference {r['max_abs_diff']:.1e} "
                  f"(relative {r['max_rel_diff']:.1e}; scores up to {r['max_score']:.2f}).", ""]
    abl = RESULTS / "moebert-ablations.json"
    if abl.is_file():
        recs = {r["ablation"]: r for r in json.loads(abl.read_text())}
        any_rec = next(iter(recs.values()))
        lines += [f"**Ablations** on {any_rec['task']} dev ({any_rec['main_metric']}), every run {any_rec['max_steps']} "
                  f"optimizer steps of batch 32 at lr {ABLATION_LR:g}, the paper's conversion (no refit), "
                  f"from the same fine-tuned teacher (teacher "
                  f"{any_rec['metrics']['teacher'][any_rec['main_metric']]:.4f}); one seed each, and two seeds of the "
                  f"full SST-2 run differ by up to a point, so differences of that size are within noise.", "",
                  "| ablation | variants (dev score) | paper's direction | held here? |", "|---|---|---|---|"]
        for title, names, claim, held in GROUPS:
            if not all(n in recs for n in names):
                continue
            scores = {n: student_score(recs[n]) for n in names}
            cells = ", ".join(f"{'default (import, s=256, all, hash-r, tied)' if n == 'default' else n} {scores[n]:.4f}"
                              for n in names)
            verdict = "—" if held is None else ("yes" if held(scores) else "no")
            lines.append(f"| {title} | {cells} | {claim} | {verdict} |")
        lines.append("")
    seeds = RESULTS / "moebert-seeds.json"
    if seeds.is_file():
        by_variant: dict[str, list[dict]] = {}
        for r in json.loads(seeds.read_text()):
            by_variant.setdefault(r["variant"], []).append(r)
        lines += ["**Seeds** (SST-2, quick budget, the same cached teacher and 20k examples, student seed varied): "
                  "student − teacher dev accuracy in points.", "",
                  "| setting | seeds | teacher | student per seed | gap per seed | mean gap ± standard error |",
                  "|---|---|---|---|---|---|"]
        for variant, recs in by_variant.items():
            teacher = recs[0]["metrics"]["teacher"]["accuracy"]
            gaps = [100 * (student_score(r) - teacher) for r in recs]
            error = f" ± {statistics.stdev(gaps) / len(gaps) ** 0.5:.2f}" if len(gaps) > 1 else ""
            spelled = " ".join(f"{k}={v}" for k, v in {**recs[0]["options"], **recs[0]["settings"]}.items())
            name = f"default ({spelled})" if variant == "default" and spelled else variant
            lines.append(f"| {name} | {', '.join(str(r['seed']) for r in recs)} | {teacher:.4f} | "
                         f"{', '.join(f'{student_score(r):.4f}' for r in recs)} | {', '.join(f'{g:+.2f}' for g in gaps)} | "
                         f"{statistics.mean(gaps):+.2f}{error} |")
        lines.append("")
    speed = RESULTS / "moebert-speed.json"
    if speed.is_file():
        from distillery.bench import format_bench_table

        for b in json.loads(speed.read_text()):  # one measurement per thread count
            lines += [f"**Variants measured together**, {b['hardware']['threads']} thread(s), {b['settings']['latency_runs']} "
                      f"interleaved runs (one process; FLOP-ideal ratio in brackets):", "", format_bench_table(b), ""]
    return "\n".join(lines)


def write_docs_block() -> None:
    replace_block(DOCS / "moebert.md", "moebert", docs_block())


def main() -> None:
    parser = task_parser(__doc__, ["sst2", "mrpc", "stsb", "cola", "rte", "squad"], "moebert")
    parser.add_argument("--only", nargs="+", choices=["main", "importance", "ablations", "speed", "int8", "latency",
                                                     "seeds"],
                        help="steps to run (default: main, importance, ablations, speed, latency; with --rebench: main)")
    parser.add_argument("--importance-examples", type=int, default=512)
    parser.add_argument("--importance-repeats", type=int, default=3, help="timed runs of each (median)")
    parser.add_argument("--ablation-task", default="sst2")
    parser.add_argument("--ablation-steps", type=int, default=300)
    parser.add_argument("--ablations", nargs="+", choices=list(ABLATIONS), help="A subset of the ablation runs.")
    parser.add_argument("--latency-runs", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44], help="seeds: the student seeds.")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="seeds: a dotted run setting, e.g. student.batch_size=16 (repeatable).")
    parser.add_argument("--speed-threads", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--pair-runs", type=int, default=200, help="latency: interleaved runs per set.")
    parser.add_argument("--latency-repeats", type=int, default=8, help="latency: sets per thread count.")
    args = parser.parse_args()
    if args.only is None:  # --rebench re-measures the task runs; it never trains the ablations again
        args.only = ["main"] if args.rebench else ["main", "importance", "ablations", "speed", "latency"]
    setup_logging()
    RESULTS.mkdir(parents=True, exist_ok=True)
    for step in args.only:
        {"main": run_main, "importance": run_importance, "ablations": run_ablations, "speed": run_speed,
         "int8": run_int8, "latency": run_latency, "seeds": run_seeds}[step](args)


if __name__ == "__main__":
    main()
