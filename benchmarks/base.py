"""The seeds' scale: every method from the base-size teacher (``--teacher mpnet-base``, all-mpnet-base-v2:
12 layers, hidden 768, FFN 3072, 110M parameters) on SST-2, with each model's int8 export.

    python benchmarks/base.py --data-dir ../shared/data                 # quality runs, then speed, then docs
    python benchmarks/base.py --data-dir ../shared/data --only speed    # speed of the finished runs again (quiet machine)
    python benchmarks/base.py --data-dir DATA --only quality --budget gpu  # the quick budget, on a lent GPU

quality  ``distillery compress --teacher mpnet-base --export int8`` per row into runs/base-sst2-<row>/: ``distill``
         (6 of 12 layers; and 3 of 12, the layer-drop student that the 4× search must beat), ``moebert``,
         ``autotinybert`` at 2×, 4× and 8× latency budgets (the 2× and 8× runs search in the 4× run's super-net,
         as ``--option supernet=RUN/supernet`` lets any user do), ``cmow``. One
         fine-tuned teacher serves them all (the teacher cache). The budget is sized to finish in one sitting on
         2 CPU cores (``--train-limit``, ``--max-length``, two student epochs; see BUDGET); every run keeps its own
         provisional bench.json (few runs, small throughput batch): the published speed is the next phase's.
         → benchmarks/results/base-quality.json
         ``--budget gpu``: the quality rows the acceptance names (distill, distill-3layers, moebert, autotinybert 4×)
         at the pipeline's quick budget, unchanged, for a GPU, and longer trainings (see GPU_ROWS)
         → benchmarks/results/base-quality-gpu.json
speed    The fine-tuned teacher, every student, each one's int8 export and MoEBERT's no-routing bound (the
         teacher with every FFN cut to one expert's width: a token's MoE FLOPs with no dispatch at all) measured
         together in ONE interleaved benchmark per thread count (1 and 2): 1×128 latency, 256×64 throughput,
         FLOP-ideal ratios. → benchmarks/results/base-speed.json
dispatch One MoEBERT FFN layer alone (base_moebert.py): the batched dispatch, the per-expert loop, two floors, a dense FFN.
         → benchmarks/results/base-dispatch.json
bound    MoEBERT against its bound in small processes of their own, with a copy that skips the dispatch's data
         movement, at 1×128 and longer sequences (--bound-lengths). → benchmarks/results/base-bound.json
docs     The "base-size teacher" block of docs/results.md and the README's base rows, from the results files.

Records are stored under a "records" key, so the MiniLM tables (benchmarks/common.py) never pick them up.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from base_checks import at_two_threads, int8_key, int8_accuracy, longer_lines, quality_checks, speed_checks
from base_moebert import bound_lines, bound_records, dispatch_lines, dispatch_records
from common import README, RESULTS, RESULTS_DOC, record_from_run, replace_block

TEACHER = "mpnet-base"
TASK = "sst2"
# label -> (method, method options). The 4× run trains the super-net; the 2× and 8× students are searched in it
# and trained further as the 4× one is (extracted alone, the 8× sub-network scored at chance). Each is compared
# with the layer-drop students around its measured speed (distill: 6 of 12 layers, 3, 2 and 1).
ROWS = {
    "distill": ("distill", {}),
    "distill-3layers": ("distill", {"student_layers": 3}),  # the layer-drop student of the 4× budget's speed
    "cmow": ("cmow", {}),
    "moebert": ("moebert", {}),
    "autotinybert-4x": ("autotinybert", {"speedup": 4}),
    "autotinybert-2x": ("autotinybert", {"speedup": 2}),
    "autotinybert-8x": ("autotinybert", {"speedup": 8}),
    "distill-2layers": ("distill", {"student_layers": 2}),  # the layer-drop students around the 8× budget's speed
    "distill-1layer": ("distill", {"student_layers": 1}),
    # The packaged MiniLM (6x384, its own WordPiece tokenizer, before any fine-tuning) as a pretrained student:
    # fine-tuned alone on the same labelled sentences (kd_weight 0: the gold labels only), distilled from the
    # fine-tuned teacher, and distilled with TinyBERT's augmentation of those sentences (2 new per original,
    # labelled by the teacher; 4 would double the sitting's labelling time).
    "minilm-alone": ("distill", {"student": "minilm", "kd_weight": 0.0}),
    "minilm-distilled": ("distill", {"student": "minilm"}),
    "minilm-distilled-augment": ("distill", {"student": "minilm", "augment": 2}),
    # the 4× layer-drop student with the same augmented text (issue 39's base-size 4× row)
    "distill-3layers-augment": ("distill", {"student_layers": 3, "augment": 2}),
}
# How the README names a row: the flags that make that student.
README_LABELS = {"minilm-distilled": "--student minilm", "minilm-distilled-augment": "--student minilm --augment 2"}
# Rows whose student reads its own tokenizer: its int8 export is scored by its own run (``--export int8``).
OWN_TOKENIZER = ("minilm-alone", "minilm-distilled", "minilm-distilled-augment")
SUPERNET_ROW = "autotinybert-4x"
BASELINE_ROW = "distill"
# The sitting's budget on 2 CPU cores (about 100 min for the whole script, measured: 16 min of teacher fine-tuning,
# 67 min of students, 16 min of speed): a train slice, SST-2's sentences at most 64 tokens, one epoch of teacher
# fine-tuning and two of each student's training; every student trains on the same slice (``train_examples=budget``:
# labelling all 67k sentences with a base-size teacher alone would take most of the sitting). The one-shot phase
# keeps its 300 super-net steps; the search is cut to match (60 timed architectures; 2 generations of 8 candidates
# probed on 512 + 256 examples).
BUDGET = {"data.max_length": 64, "teacher.train.epochs": 1.0, "bench.latency_runs": 5, "bench.warmup": 1,
          "bench.throughput_runs": 1, "bench.throughput_shape": [32, 64]}
STUDENT_EPOCHS = {"distill": 2.0, "moebert": 2.0, "autotinybert": 2.0}  # cmow keeps its own 5 epochs (it is cheap)
# label -> (the row of ROWS it trains, settings over that row's): the sitting's longer trainings, run when --rows
# names them. MoEBERT for the 5 epochs of the paper's SST-2 recipe (Table 7): 30 min here (measured).
SITTING_VARIANTS = {"moebert-5epochs": ("moebert", {"student.epochs": 5.0})}
METHOD_BUDGET = {
    "distill": {"train_examples": "budget"},
    "cmow": {"train_examples": "budget"},
    "autotinybert": {"train_examples": "budget", "latency_archs": 60, "generations": 2,
                     "population": 8, "probe_examples": 512, "proxy_examples": 256},
}

# ``--budget gpu``: the pipeline's quick budget as it stands (20k train examples, 64 tokens, two epochs of the
# teacher's fine-tuning and of each student's training, evaluation every 200 steps), which a lent GPU runs in
# minutes. Every student trains on the teacher's 20k slice, as in the sitting. The 4× row trains the architecture
# the sitting's search chose on 2 CPU cores: its speed is the one the speed phase measured (a search on the GPU
# would time the GPU). No int8 export: onnxruntime runs int8 on the CPU, and the sitting scores each export.
# label -> (the row of ROWS it trains, settings over the quick budget). The last four ask whether more training
# closes the gaps: MoEBERT for the 5 epochs of the paper's SST-2 recipe (Table 7), the 4× super-net for 5× the steps,
# and distill and the 4× student on the whole train split labelled by the teacher (the methods' own default).
GPU_ROWS = {
    "moebert": ("moebert", {}),
    "distill": ("distill", {}),
    "autotinybert-4x": ("autotinybert-4x", {}),
    "distill-3layers": ("distill-3layers", {}),
    **SITTING_VARIANTS,  # moebert-5epochs
    "autotinybert-4x-1500steps": ("autotinybert-4x", {"method_options.supernet_steps": 1500}),
    "distill-all": ("distill", {"method_options.train_examples": "all"}),
    "autotinybert-4x-all": ("autotinybert-4x", {"method_options.train_examples": "all"}),
}
GPU_BUDGET = {k: v for k, v in BUDGET.items() if k.startswith("bench.")}  # each run's provisional bench, as above
GPU_METHOD_BUDGET = {"distill": {"train_examples": "budget"}, "autotinybert": {"train_examples": "budget"}}


def sitting_arch(label: str) -> str:
    """The architecture the sitting's search chose for row ``label`` (its run's notes), as ``l,d_m,d_f,h,d_qkv``."""
    import re

    record = next((r for r in load("base-quality") if r["method"] == label), None)
    note = next((n for n in (record or {}).get("notes", []) if n.startswith("Architecture: l=")), None)
    if note is None:
        raise SystemExit(f"No searched architecture for {label} in benchmarks/results/base-quality.json: run the "
                         f"sitting's quality phase first, or give one with --arch.")
    return ",".join(re.search(rf"\b{k}=(\d+)", note).group(1) for k in ("l", "d_m", "d_f", "h", "d_qkv"))


# ``--converted``: the same rows with one optimizer step each (teacher included), for speed alone: a converted or
# extracted model times the same as a trained one. The search keeps its latency predictor (60 timed architectures)
# and scores a handful of candidates on few examples: what it picks for the budget is what the speed rows test.
CONVERTED = {"data.train_limit": 512, "teacher.train.max_steps": 1, "student.max_steps": 1}
CONVERTED_OPTIONS = {
    "moebert": {"importance_examples": 64},
    "autotinybert": {"supernet_steps": 1, "rewire_examples": 64, "probe_examples": 64, "proxy_examples": 64,
                     "population": 4, "generations": 1},
}


def run_dir(args, label: str) -> Path:
    kind = "converted-" if args.converted else "gpu-" if args.budget == "gpu" else ""
    return Path(args.runs_dir) / f"base-{kind}{TASK}-{label}"


def row_of(args, label: str) -> tuple[str, dict]:
    """The row of ROWS that ``label`` trains, and its settings over that row's (a longer training, a GPU row)."""
    return GPU_ROWS[label] if args.budget == "gpu" else SITTING_VARIANTS.get(label, (label, {}))


def overrides_for(args, label: str) -> dict:
    row, settings = row_of(args, label)
    if args.budget == "gpu":
        method, options = ROWS[row]
        out = {**GPU_BUDGET, **({"data.train_limit": args.train_limit} if args.train_limit else {})}
        opts = {**GPU_METHOD_BUDGET.get(method, {}), **options}
        if method == "autotinybert":
            opts["arch"] = args.arch or sitting_arch(row)
        return {**out, **{f"method_options.{k}": v for k, v in opts.items()}, **settings}
    method, options = ROWS[row]
    out = {**BUDGET, "data.train_limit": args.train_limit or 8000}
    if args.converted:
        out.update(CONVERTED)
        options = {**CONVERTED_OPTIONS.get(method, {}), **options}
    if method in STUDENT_EPOCHS and not args.converted:
        out["student.epochs"] = STUDENT_EPOCHS[method]
    opts = {**METHOD_BUDGET.get(method, {}), **options}
    if method == "autotinybert" and row != SUPERNET_ROW:
        opts["supernet"] = str(run_dir(args, SUPERNET_ROW) / "supernet")
    out.update({f"method_options.{k}": v for k, v in opts.items()})
    return {**out, **settings}


def quality_record(args, label: str) -> dict:
    import torch

    folder = run_dir(args, label)
    rec = record_from_run(folder, label, "base-gpu" if args.budget == "gpu" else "base-sitting")
    metrics = json.loads((folder / "metrics.json").read_text())
    rec["others"] = metrics.get("others", {})  # the int8 exports' dev scores
    rec["settings_overrides"] = overrides_for(args, label)
    # the bench's fingerprint is the CPU's (speed is the speed phase's): say where the training ran
    rec["trained_on"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return rec


def run_quality(args) -> None:
    from distillery.pipeline import build_run_config, compress

    gpu = args.budget == "gpu"
    results = "base-quality-gpu" if gpu else "base-quality"
    order = list(GPU_ROWS) if gpu else [*ROWS, *SITTING_VARIANTS]
    for label in [r for r in order if r in args.rows] if args.rows else list(GPU_ROWS if gpu else ROWS):
        out = run_dir(args, label)
        if not (args.reuse and (out / "report.md").is_file()):
            started = time.time()
            method = ROWS[row_of(args, label)[0]][0]
            config = build_run_config(method=method, task=TASK, budget="quick", teacher=args.teacher,
                                      data_dir=args.data_dir, out=str(out), overrides=overrides_for(args, label))
            config.export = [] if args.converted or gpu else ["int8"]  # the speed phase exports for itself
            # The free baselines belong to the teacher, shared by every row: measured once, in the first row's run.
            config.baselines = not args.converted and not gpu and label == BASELINE_ROW
            try:
                compress(config, overwrite=True)
            except Exception as e:  # noqa: BLE001 - one failed row must not cost the sitting's other rows
                logging.getLogger("distillery").exception("%s failed", label)
                print(f"{label}: FAILED ({type(e).__name__}: {e})", flush=True)
                continue
            print(f"{label}: {(time.time() - started) / 60:.1f} min", flush=True)
        if not args.converted:
            records = {r["method"]: r for r in load(results)}
            records[label] = quality_record(args, label)
            save(results, [records[k] for k in order if k in records])


def load(name: str) -> list[dict]:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text())["records"] if path.is_file() else []


def save(name: str, records: list[dict]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"records": records}, indent=2) + "\n")


def speed_models(args) -> tuple[dict, dict]:
    """Teacher, every finished run's student, MoEBERT's no-routing bound, and the int8 export of each; with the
    exports' SST-2 dev scores (trained runs): {name: {"accuracy", "fp32", "format"}}, exported by this code."""
    from moebert import narrow_ffn
    from transformers import AutoTokenizer

    from distillery.export import build_variants, prepare_export_data
    from distillery.runtime import load_model

    finished = [label for label in ROWS if (run_dir(args, label) / "student").is_dir()
                and (not args.rows or label in args.rows)]
    if not finished:
        raise SystemExit("No finished base-size run under runs/: run the quality phase first.")
    first = run_dir(args, finished[0])
    teacher_path = json.loads((first / "train.json").read_text())["teacher_path"]
    fp32 = {"teacher": load_model(teacher_path)}
    fp32.update({label: load_model(run_dir(args, label) / "student") for label in finished})
    if "moebert" in fp32:
        fp32["no-routing bound"] = narrow_ffn(fp32["teacher"], fp32["moebert"].config.expert_size)
    tokenizer = AutoTokenizer.from_pretrained(teacher_path)
    scored, task_data, source = {}, None, {}
    if not args.converted:  # the int8 column: each export scored on dev beside its fp32 model's own score
        task_data = prepare_export_data(TASK, tokenizer, run_dir=first, data_dir=args.data_dir)
        for label in finished:
            metrics = json.loads((run_dir(args, label) / "metrics.json").read_text())
            source[label] = metrics["student"]
            source.setdefault("teacher", metrics["teacher"])
    same = {k: (m, tokenizer) for k, m in fp32.items() if k != "no-routing bound" and k not in OWN_TOKENIZER}
    int8, scores, _ = build_variants(same, ["int8"], task_data=task_data, source_metrics=source)
    own = {k: (m, AutoTokenizer.from_pretrained(run_dir(args, k) / "student")) for k, m in fp32.items() if k in OWN_TOKENIZER}
    int8.update(build_variants(own, ["int8"])[0])  # timed here; scored on dev by their own runs
    for key, metric in scores.items():  # "<name>-<backend>-int8"
        name, backend, bits = key.rsplit("-", 2)
        scored[name] = {"accuracy": metric["accuracy"], "fp32": source[name]["accuracy"], "format": f"{backend}-{bits}"}
    return {**fp32, **int8}, scored


# ``--only speed --rows ...``: rows finished (or trained again) after the speed phase, timed beside the teacher in a
# process of their own; the tables take each such row's speed-ups from here (a ratio to the same fp32 teacher
# architecture), the latest timing of a row winning.
ADDED_SPEED = "base-speed-added"


def run_speed(args) -> None:
    from distillery.bench import benchmark, format_bench_table

    models, int8_scores = speed_models(args)
    benches = []
    for threads in args.threads:
        started = time.time()
        bench = benchmark(models, threads=threads, latency_runs=args.latency_runs, throughput_runs=args.throughput_runs)
        print(f"{threads} thread(s), {(time.time() - started) / 60:.1f} min\n{format_bench_table(bench)}", flush=True)
        bench["source"] = "converted (one optimizer step)" if args.converted else "trained (the quality runs)"
        bench["int8_scores"] = int8_scores
        benches.append(bench)
        save(ADDED_SPEED, added_with(load(ADDED_SPEED), benches)) if args.rows else save("base-speed", benches)


def timed_rows(bench: dict) -> set[str]:
    return {k for k in bench["models"] if not k.startswith("teacher") and not k.endswith("int8")}


def added_with(added: list[dict], benches: list[dict]) -> list[dict]:
    """The rows timed later, each call's processes kept as they are, with ``benches`` replacing an earlier timing
    of the same rows."""
    rows = set().union(*(timed_rows(b) for b in benches)) if benches else set()
    return [b for b in added if not timed_rows(b) <= rows] + benches


def with_added(benches: list[dict], added: list[dict]) -> list[dict]:
    """``benches`` with the rows timed later (:data:`ADDED_SPEED`) at the same thread count. A later timing wins: a
    row timed again was trained again (a new search may pick another architecture); the teacher's own rows stay."""
    merged = []
    for bench in benches:
        for extra in (b for b in added if b["hardware"]["threads"] == bench["hardware"]["threads"]):
            later = {k for k in extra["speedups"] if not k.startswith("teacher")}
            pick = lambda d: {k: v for k, v in d.items() if k in later}  # noqa: E731
            bench = {**bench, "models": {**extra["models"], **bench["models"], **pick(extra["models"])},
                     "speedups": {**bench["speedups"], **pick(extra["speedups"])},
                     "int8_scores": {**bench.get("int8_scores", {}), **extra.get("int8_scores", {})}}
        merged.append(bench)
    return merged


def added_line(added: list[dict]) -> list[str]:
    if not added:
        return []
    names = sorted(set().union(*(timed_rows(b) for b in added)))
    return [f"- Timed later, beside the same teacher architecture in a process of their own "
            f"(`--only speed --rows`, {ADDED_SPEED}.json): {', '.join(names)}."]


def run_dispatch(args) -> None:
    save("base-dispatch", dispatch_records(args.threads, args.dispatch_runs))


def run_bound(args) -> None:
    """``--bound-repeats`` more processes, added to the records already there (the share moves with the machine's
    speed; delete results/base-bound.json to start over)."""
    save("base-bound", load("base-bound") + bound_records(run_dir(args, "moebert"), args.bound_repeats,
                                                          args.latency_runs, tuple(args.bound_lengths)))


def _speedups(bench: dict, name: str) -> dict:
    one = {"latency": 1.0, "throughput": 1.0, "flop_ideal_latency": 1.0, "flop_ideal_throughput": 1.0}
    return bench["speedups"].get(name, one if name == bench["settings"].get("reference", "teacher") else None)


def _speed_cells(bench: dict, name: str) -> str:
    s = _speedups(bench, name)
    return (f"{s['latency']:.2f}× ({s['flop_ideal_latency']:.2f}×) | "
            f"{s['throughput']:.2f}× ({s['flop_ideal_throughput']:.2f}×)")


def base_table(quality: list[dict], benches: list[dict]) -> str:
    by_threads = {b["hardware"]["threads"]: b for b in benches}
    two = by_threads.get(2) or (benches[0] if benches else None)
    one = by_threads.get(1)
    rows = {r["method"]: r for r in quality}
    lines = ["| model | SST-2 dev acc. | int8 export | params | latency 2 thr. (FLOP-ideal) | throughput 2 thr. "
             "(FLOP-ideal) | latency 1 thr. | throughput 1 thr. |", "|---|---|---|---|---|---|---|---|"]
    first = next(iter(rows.values()), None)
    names = ["teacher", *ROWS, "no-routing bound"]
    for name in names:
        if two is None or name not in two["models"]:
            continue
        if name == "teacher":
            acc = f"{first['metrics']['teacher']['accuracy']:.4f}" if first else "—"
        elif name in rows:
            acc = f"{rows[name]['metrics']['student']['accuracy']:.4f}"
        else:
            acc = "—"
        q8 = int8_accuracy(name, quality, benches)
        int8_cell = "—" if q8 is None else f"{q8:.4f}"
        int8_speed = int8_key(two, name)
        params = two["models"][name]["params"] / 1e6
        lines.append(f"| {name} | {acc} | {int8_cell} | {params:.1f}M | {_speed_cells(two, name)} | "
                     + (f"{_speedups(one, name)['latency']:.2f}× | {_speedups(one, name)['throughput']:.2f}× |" if one else "— | — |"))
        if int8_speed:
            lines.append(f"| {name} int8 | | | | {_speed_cells(two, int8_speed)} | "
                         + (f"{one['speedups'][int8_speed]['latency']:.2f}× | {one['speedups'][int8_speed]['throughput']:.2f}× |"
                            if one else "— | — |"))
    if two:
        hw = two["hardware"]
        teacher = two["models"]["teacher"]
        source = two.get("source", "")
        lines += ["", f"Models timed: {source}. Speed-ups against the fp32 teacher (1×128 latency {teacher['latency_ms']['median']:.0f} ms at 2 threads), "
                  f"all models in one interleaved process per thread count, on {hw.get('cpu')} ({hw.get('cores')} cores), "
                  f"torch {hw.get('torch')}.", "", *speed_checks(by_threads), *quality_checks(quality, benches, OWN_TOKENIZER),
                  *longer_lines(quality, SITTING_VARIANTS), *added_line(load(ADDED_SPEED))]
    return "\n".join(lines)


def gpu_table(quality: list[dict]) -> str:
    """The quick budget trained on a lent GPU: each row's dev score against the same teacher, and the checks."""
    teacher = quality[0]["metrics"]["teacher"]["accuracy"]
    lines = ["| row | SST-2 dev acc. | points under the teacher | settings over the quick budget | student training (s) |",
             "|---|---|---|---|---|",
             f"| teacher | {teacher:.4f} | — | — | {quality[0]['teacher_train_seconds']:.0f} (fine-tuning) |"]
    for r in quality:
        acc = r["metrics"]["student"]["accuracy"]
        extra = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in GPU_ROWS[r["method"]][1].items()) or "—"
        lines.append(f"| {r['method']} | {acc:.4f} | {100 * (teacher - acc):.2f} | {extra} | {r['train_seconds']:.0f} |")
    where = quality[0].get("trained_on", "a GPU")
    intro = (f"Trained on {where} at the pipeline's quick budget (`python benchmarks/base.py --budget gpu --only "
             "quality`): 20,000 SST-2 sentences of at most 64 tokens, two epochs of the teacher's fine-tuning and of "
             "each student's training, every student on the teacher's 20k slice; the 4× row trains the architecture "
             "the sitting's search chose (its speed is the table's above). No int8 exports (the sitting scores them).")
    return "\n".join([intro, "", *lines, "",
        *quality_checks([r for r in quality if not GPU_ROWS[r["method"]][1]], []), *longer_lines(quality, GPU_ROWS)])


def write_docs() -> None:
    added = load(ADDED_SPEED)
    quality, benches = load("base-quality"), with_added(load("base-speed"), added)
    dispatch = load("base-dispatch")
    table = base_table(quality, benches)
    gpu_quality = load("base-quality-gpu")
    if gpu_quality:
        table += "\n\nThe same rows at the quick budget, trained on a GPU:\n\n" + gpu_table(gpu_quality)
    bound = load("base-bound")
    if bound:
        table += "\n\n" + "\n".join(bound_lines(bound))
    if dispatch:
        table += "\n\nOne MoEBERT FFN layer alone (benchmarks/base.py --only dispatch):\n\n" + "\n".join(dispatch_lines(dispatch))
    replace_block(RESULTS_DOC, "base", table)
    replace_block(README, "base-summary", readme_rows(quality, benches, gpu_quality))


def readme_rows(quality: list[dict], benches: list[dict], gpu: list[dict]) -> str:
    """The README's headline rows: speed at 2 threads (fp32 and int8), and the dev score where a quality run finished:
    the sitting's, and the quick budget's trained on a GPU."""
    two = at_two_threads(benches) or (benches[0] if benches else None)
    if two is None:
        return "Not measured yet: `python benchmarks/base.py`."
    scores = {r["method"]: r["metrics"]["student"]["accuracy"] for r in quality}
    quick = {r["method"]: r["metrics"]["student"]["accuracy"] for r in gpu}
    if gpu:
        quick["teacher"] = gpu[0]["metrics"]["teacher"]["accuracy"]
    rows = ["| base-size teacher (mpnet-base, 110M), 2 threads | latency speed-up | with int8 | SST-2 dev (2-core CPU budget) | "
            "quick budget (GPU) |", "|---|---|---|---|---|"]
    teacher_int8 = int8_key(two, "teacher")
    if quality and teacher_int8:
        rows.append(f"| teacher (fine-tuned) | 1.00× | {two['speedups'][teacher_int8]['latency']:.2f}× | "
                    f"{quality[0]['metrics']['teacher']['accuracy']:.3f} | {_score(quick, 'teacher')} |")
    for name in ("distill", "moebert", "autotinybert-4x", "distill-3layers", "minilm-distilled", "minilm-distilled-augment",
                 "cmow"):
        if name in two["speedups"]:
            int8 = int8_key(two, name)
            int8_cell = f"{two['speedups'][int8]['latency']:.2f}×" if int8 else "—"
            rows.append(f"| `{README_LABELS.get(name, name)}` | {two['speedups'][name]['latency']:.2f}× | {int8_cell} | {_score(scores, name)} | "
                        f"{_score(quick, name)} |")
    return "\n".join(rows)


def _score(scores: dict, name: str) -> str:
    return f"{scores[name]:.3f}" if name in scores else "—"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--only", choices=["quality", "speed", "dispatch", "bound", "docs"], default=None)
    parser.add_argument("--rows", nargs="+", default=None, choices=sorted({*ROWS, *SITTING_VARIANTS, *GPU_ROWS}),
                        help="Rows to run, of the budget's own (default: ROWS in the sitting, GPU_ROWS with --budget gpu; "
                             "the sitting's longer trainings, SITTING_VARIANTS, only when named).")
    parser.add_argument("--train-limit", type=int, default=None,
                        help="Train examples of the teacher and students (default: 8000 in the sitting, the quick "
                             "budget's 20000 with --budget gpu).")
    parser.add_argument("--budget", choices=["sitting", "gpu"], default="sitting",
                        help="sitting: sized for 2 CPU cores (BUDGET); gpu: the quick budget, for a lent GPU.")
    parser.add_argument("--teacher", default=TEACHER, help="The base-size teacher: mpnet-base or a model folder.")
    parser.add_argument("--arch", default=None, help="--budget gpu: the 4× row's architecture l,d_m,d_f,h,d_qkv "
                        "(default: the one the sitting's search chose).")
    parser.add_argument("--converted", action="store_true",
                        help="Runs of one optimizer step each (speed needs no training): runs/base-converted-*.")
    parser.add_argument("--reuse", action="store_true", help="Keep finished run folders as they are.")
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--latency-runs", type=int, default=40)
    parser.add_argument("--throughput-runs", type=int, default=3)
    parser.add_argument("--dispatch-runs", type=int, default=200)
    parser.add_argument("--bound-repeats", type=int, default=3)
    parser.add_argument("--bound-lengths", type=int, nargs="+", default=[128, 256, 512],
                        help="--only bound: the sequence lengths (batch 1) each process times.")
    args = parser.parse_args()
    from distillery.cli import setup_logging

    setup_logging()
    if args.only in (None, "quality"):
        run_quality(args)
    if args.only in (None, "speed"):
        run_speed(args)
    if args.only in (None, "dispatch"):
        run_dispatch(args)
    if args.only in (None, "bound"):
        run_bound(args)
    write_docs()


if __name__ == "__main__":
    main()
