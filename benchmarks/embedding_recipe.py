"""Issue 55: the layer-drop embedder's recipe (learning rate, how much text, passes), chosen on a held-out check that is
not the benchmark's dev split: Spearman of the cosines on 1,500 STS-B TRAIN pairs (a fixed random sample) and the
mean cosine of the student's vectors to the teacher's on 1,000 held-out Wikipedia sentences.

    distillery transfer-set --corpus WIKI --single --rows 8000 --out wiki8k.jsonl
    distillery transfer-set --corpus WIKI --single --rows 10000 --seed 1 --out wiki-extra.jsonl
    python benchmarks/embedding_recipe.py --texts wiki8k.jsonl --extra wiki-extra.jsonl --work WORK \\
        --runs 1e-4:8000:1 5e-4:8000:1 5e-4:16000:1

Each run (``LR:TEXTS:PASSES``) trains a student of 3 of the teacher's 6 layers (distill's layer drop: layers 0, 2, 4)
as the run's loop does (AdamW, weight decay 0.01 but none on biases and norms, linear decay, no warm-up, gradient
clip 1, batches of 32 texts of similar lengths) on the kind's loss (``1 − cos + MSE`` of the unit vectors), from the
first TEXTS sentences of ``--texts`` then of ``--extra`` (held-out sentences and those of ``--texts`` left out). The
teacher's vectors are computed once into WORK. One JSON line a run goes to WORK/recipe.jsonl; the check's scores are
printed every ``--eval-every`` steps. The measured benchmark run of the chosen recipe is benchmarks/embedding.py's.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

STS_PAIRS, HELD_OUT, BATCH = 1500, 1000, 32


def texts_of(path: str) -> list[str]:
    return [json.loads(line)["text"] for line in Path(path).read_text().splitlines() if line.strip()]


def length_groups(lengths: np.ndarray, size: int, rng: np.random.Generator | None = None) -> list[np.ndarray]:
    order = np.argsort(lengths, kind="stable")
    groups = [order[i:i + size] for i in range(0, len(order), size)]
    if rng is not None:
        rng.shuffle(groups)
    return groups


class Check:
    """The teacher, its tokenizer, the held-out check's texts and the teacher's vectors (cached in ``work``)."""

    def __init__(self, args):
        from transformers import AutoModel, AutoTokenizer

        from distillery.teacher import resolve_teacher

        path = resolve_teacher(args.teacher)
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        self.teacher = AutoModel.from_pretrained(path, trust_remote_code=False).eval()
        self.work, self.max_length = Path(args.work), args.max_length
        self.work.mkdir(parents=True, exist_ok=True)
        rows = list(csv.reader(open(args.sts_train), delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
        pick = np.random.default_rng(0).choice(len(rows), STS_PAIRS, replace=False)
        self.first, self.second = [rows[i][7] for i in pick], [rows[i][8] for i in pick]
        self.gold = np.array([float(rows[i][9]) for i in pick])
        base = texts_of(args.texts)
        seen = set(base)
        extra = [t for t in dict.fromkeys(texts_of(args.extra)) if t not in seen]
        self.held, self.pool = extra[:HELD_OUT], base + extra[HELD_OUT:]
        self.held_vectors = self.vectors("held", self.held)
        self.teacher_sts = self.sts(self.teacher)

    def forward(self, model, texts: list[str]) -> torch.Tensor:
        from distillery.kinds.embedding import mean_pooled

        enc = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        out = model(**enc)
        return F.normalize(mean_pooled(out.last_hidden_state, enc["attention_mask"]), dim=-1)

    @torch.inference_mode()
    def encode(self, model, texts: list[str]) -> torch.Tensor:
        model.eval()
        out = torch.zeros(len(texts), model.config.hidden_size)
        for idx in length_groups(np.array([len(t) for t in texts]), 128):
            out[torch.as_tensor(idx)] = self.forward(model, [texts[i] for i in idx]).float()
        return out

    def vectors(self, name: str, texts: list[str]) -> torch.Tensor:
        path = self.work / f"teacher-{name}-{len(texts)}.npy"
        if not path.is_file():
            np.save(path, self.encode(self.teacher, texts).numpy())
        return torch.from_numpy(np.load(path))

    def sts(self, model) -> float:
        from scipy.stats import spearmanr

        a, b = self.encode(model, self.first), self.encode(model, self.second)
        return float(spearmanr((a * b).sum(-1).numpy(), self.gold).correlation)

    def scores(self, model) -> dict:
        sts = self.sts(model)
        held = float((self.encode(model, self.held) * self.held_vectors).sum(-1).mean())
        return {"sts_train": sts, "sts_kept": sts / self.teacher_sts, "held_cos": held}


def train(check: Check, lr: float, n: int, passes: float, layers: int, eval_every: int | None, seed: int = 42) -> dict:
    from distillery.config import TrainConfig
    from distillery.distill.recipe import build_student, select_layers
    from distillery.kinds.embedding import embedding_distance
    from distillery.training.optim import optimizer_and_schedule

    texts = check.pool[:n]
    targets = check.vectors("train", texts)
    torch.manual_seed(seed)
    student = build_student(check.teacher, select_layers(check.teacher.config.num_hidden_layers, layers)).train()
    total = math.ceil(math.ceil(len(texts) / BATCH) * passes)
    optimizer, schedule = optimizer_and_schedule(student, [], [], TrainConfig(lr=lr), torch.device("cpu"), total)
    rng, lengths, step, started, curve = np.random.default_rng(seed), np.array([len(t) for t in texts]), 0, time.time(), []
    while step < total:
        for idx in length_groups(lengths, BATCH, rng):
            loss = embedding_distance(check.forward(student, [texts[i] for i in idx]), targets[torch.as_tensor(idx)])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step == total or (eval_every and step % eval_every == 0):
                curve.append({"step": step, **check.scores(student), "seconds": round(time.time() - started, 1)})
                print(f"lr {lr:g}, {n} texts, {passes:g} passes: {curve[-1]}", flush=True)
                student.train()
            if step == total:
                break
    return {"lr": lr, "texts": len(texts), "passes": passes, "layers": layers, "teacher_sts_train": check.teacher_sts,
            "curve": curve}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", required=True, help="The transfer text (JSONL, a 'text' a line).")
    parser.add_argument("--extra", required=True, help="More text: the held-out sentences, then more to learn from.")
    parser.add_argument("--sts-train", default="../shared/data/glue/STS-B/train.tsv")
    parser.add_argument("--teacher", default="minilm")
    parser.add_argument("--work", required=True, help="Where the teacher's vectors and recipe.jsonl go.")
    parser.add_argument("--runs", nargs="+", default=["1e-4:8000:1", "5e-4:8000:1", "5e-4:16000:1"],
                        metavar="LR:TEXTS:PASSES")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--eval-every", type=int, default=250)
    args = parser.parse_args(argv)
    check = Check(args)
    print(f"teacher: STS-B train Spearman {check.teacher_sts:.4f}", flush=True)
    with open(Path(args.work) / "recipe.jsonl", "a") as log:
        for item in args.runs:
            lr, n, passes = item.split(":")
            log.write(json.dumps(train(check, float(lr), int(n), float(passes), args.layers, args.eval_every)) + "\n")
            log.flush()


if __name__ == "__main__":
    main()
