"""CMOW/CBOW-Hybrid students against their teacher, measured here.

    python benchmarks/cmow.py --data-dir ../shared/data                  # the five GLUE tasks (quick budget)
    python benchmarks/cmow.py --tasks sst2 --rebench                     # re-measure finished runs (quiet machine)
    python benchmarks/cmow.py --tasks mrpc --option pair_mode=joint      # a variant's own runs and rows

main        ``distillery compress --method cmow`` (bidirectional hybrid, d = 20, d_vec = 400, MLP head, DiffCat
            for pairs, task-specific distillation from random init) per task into
            runs/bench-<task>-cmow-<budget>/ → benchmarks/results/cmow-<budget>.json and the results tables
            (docs/results.md, README.md's summary): throughput at 256×64 and latency at 1×128, student and
            teacher in one process.
pretrain    general distillation on a slice of the corpus (``--corpus-lines`` lines, ``--pretrain-steps``
            steps) with the built-in teacher → runs/cmow-pretrain/ (its size and time in the results).
ablations   the paper's ablations, each a quick run beside the main one → results/cmow-ablations.json and
            the CMOW block in docs/cmow.md, with a line per ablation on whether the paper's direction held.
"""

from __future__ import annotations

import json
from pathlib import Path

from common import DOCS, RESULTS, record_from_run, replace_block, run_tasks, student_score, task_parser, upsert_result

from distillery.cli import setup_logging


# name -> (tasks, method options); the main runs (bench-<task>-cmow-quick) are each group's default.
ABLATIONS = {
    "joint": (["mrpc", "stsb", "rte"], {"pair_mode": "joint"}),
    "unidirectional": (["sst2", "mrpc"], {"bidirectional": False}),
    "general": (["sst2", "mrpc", "stsb"], {"init": "PRETRAINED", "kd_weight": 0.0}),  # was alpha=1.0: labels only
    "general+task": (["sst2", "mrpc", "stsb"], {"init": "PRETRAINED"}),
    "linear": (["sst2", "mrpc"], {"head": "linear"}),
    "cnn": (["sst2", "mrpc"], {"head": "cnn"}),
    "bilstm": (["mrpc"], {"head": "bilstm"}),  # a BiLSTM over 1200-wide embeddings on 67k SST-2 sentences: hours on 2 cores
}
DEFAULT_NAME = {"joint": "diffcat", "unidirectional": "bidirectional", "general": "task-specific",
                "general+task": "task-specific", "linear": "mlp", "cnn": "mlp", "bilstm": "mlp"}
GROUPS = [
    ("Sentence pairs (Table 3)", ["default", "joint"], "DiffCat beats the joint encoding on every pair task",
     lambda s: all(s["default"][t] > s["joint"][t] for t in s["joint"])),
    ("Directions (Table 1)", ["default", "unidirectional"], "bidirectional ≥ unidirectional (about +1 point on average)",
     lambda s: sum(s["default"][t] - s["unidirectional"][t] for t in s["unidirectional"]) >= 0),
    ("Distillation (Table 2)", ["default", "general", "general+task"],
     "general (then CE only) best on MRPC and STS-B; the three within ~1 point on SST-2",
     lambda s: all(s["general"][t] >= max(s["default"][t], s["general+task"][t]) for t in ("mrpc", "stsb") if t in s["general"])),
    ("Heads (Tables 9–11)", ["default", "linear", "cnn", "bilstm"], "MLP best on average; CNN competitive on SST-2",
     lambda s: all(sum(s["default"][t] for t in s[h]) >= sum(s[h][t] for t in s[h]) for h in ("linear", "cnn", "bilstm"))),
]


def pretrain_out(args) -> Path:
    return Path(args.runs_dir) / "cmow-pretrain"


def run_pretrain(args) -> None:
    from distillery.cmow.pretrain import pretrain
    from distillery.config import TrainConfig

    corpus = sorted(Path(args.data_dir, "corpus", "enwiki_extract").glob("*.txt"))
    train = TrainConfig(epochs=1.0, max_steps=args.pretrain_steps, batch_size=32, lr=5e-4, weight_decay=0.0,
                        select_best=False, eval_every=None, log_every=100)
    pretrain(corpus, pretrain_out(args), train=train, max_lines=args.corpus_lines, max_length=128, overwrite=True)
    facts = json.loads((pretrain_out(args) / "pretrain.json").read_text())
    (RESULTS / "cmow-pretrain.json").write_text(json.dumps(facts, indent=2))


def run_ablations(args) -> None:
    from distillery.pipeline import build_run_config, compress

    for name in args.ablations or list(ABLATIONS):
        tasks, options = ABLATIONS[name]
        options = {k: (str(pretrain_out(args) / "model") if v == "PRETRAINED" else v) for k, v in options.items()}
        for task in tasks:
            out = Path(args.runs_dir) / f"ablation-{task}-cmow-{name}"
            if not (args.reuse and (out / "report.md").is_file()):
                overrides = {"bench.latency_runs": 10, "bench.throughput_runs": 1,
                             **{f"method_options.{k}": v for k, v in options.items()}}
                compress(build_run_config(method="cmow", task=task, budget="quick", data_dir=args.data_dir,
                                          out=str(out), overrides=overrides), overwrite=True)
            rec = record_from_run(out, "cmow", "quick")
            rec.update(ablation=name, options=options)
            upsert_result("cmow-ablations", rec, key=lambda r: (r["ablation"], r["task"]))
            print(f"ablation {name} on {task}: {rec['metrics']['student'][rec['main_metric']]:.4f}")
    write_docs_block()


def ablations_block() -> str:
    lines = []
    pre = RESULTS / "cmow-pretrain.json"
    if pre.is_file():
        p = json.loads(pre.read_text())
        seen = p["steps"] * 32
        lines += [f"**General distillation** (`distillery cmow pretrain`): {p['lines']:,} lines of the Wikipedia corpus → "
                  f"{p['blocks']:,} blocks of ≤ {p['max_length']} tokens, {p['steps']} steps of batch 32 ({seen:,} blocks, "
                  f"about {seen * p['max_length'] / 1e6:.1f}M tokens) in {p['seconds'] / 60:.1f} min on this machine; the "
                  f"built-in teacher has no MLM head, so the distillation term is its last hidden state through a learned "
                  f"projection ({p['kd']}). The paper pretrained on all of Wikipedia and BookCorpus: a slice this small is "
                  f"enough to test the path, not to reproduce its Table 2.", ""]
    path = RESULTS / "cmow-ablations.json"
    main = {r["task"]: r for r in json.loads((RESULTS / "cmow-quick.json").read_text())} if (RESULTS / "cmow-quick.json").is_file() else {}
    if path.is_file() and main:
        recs = json.loads(path.read_text())
        scores = {"default": {t: student_score(r) for t, r in main.items()}}
        for r in recs:
            scores.setdefault(r["ablation"], {})[r["task"]] = student_score(r)
        lines += ["**Ablations** (quick budget, one seed each: differences under about one point are noise; each "
                  "task's main metric on dev):", "",
                  "| ablation | scores per task | paper's direction | held here? |", "|---|---|---|---|"]
        for title, names, claim, held in GROUPS:
            if any(n not in scores for n in names[1:]):
                continue
            tasks = sorted(set.union(*(set(scores[n]) for n in names[1:])) & set(scores["default"]))
            sub = {n: {t: scores[n][t] for t in tasks if t in scores[n]} for n in names}
            label = {"default": DEFAULT_NAME[names[1]]}
            cells = "; ".join(f"{t}: " + ", ".join(f"{label.get(n, n)} {sub[n][t]:.3f}" for n in names if t in sub[n])
                              for t in tasks)
            lines.append(f"| {title} | {cells} | {claim} | {'yes' if held(sub) else 'no'} |")
        lines.append("")
    return "\n".join(lines)


def write_docs_block() -> None:
    replace_block(DOCS / "cmow.md", "cmow", ablations_block())


def main() -> None:
    parser = task_parser(__doc__, ["sst2", "mrpc", "stsb", "cola", "rte"], "cmow")
    parser.add_argument("--only", nargs="+", choices=["main", "pretrain", "ablations"], default=["main", "pretrain", "ablations"])
    parser.add_argument("--ablations", nargs="+", choices=list(ABLATIONS), help="A subset of the ablations.")
    parser.add_argument("--corpus-lines", type=int, default=100_000)
    parser.add_argument("--pretrain-steps", type=int, default=1000)
    args = parser.parse_args()
    setup_logging()
    RESULTS.mkdir(parents=True, exist_ok=True)
    for step in args.only:
        if step == "main":
            run_tasks("cmow", args)
            write_docs_block()
        else:
            {"pretrain": run_pretrain, "ablations": run_ablations}[step](args)


if __name__ == "__main__":
    main()
