"""A tiny training run shared by the trainer tests and their 2-process launch.

Run as a script (``accelerate launch --num_processes 2 ... tests/_ddp_train.py OUT``) it trains the
tiny model and writes the final weights to ``OUT/final.safetensors`` from the main process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from distillery.config import TrainConfig
from distillery.training import Trainer
from tests.helpers import TINY_BERT, tiny_bert_config

VOCAB, SEQ = TINY_BERT["vocab_size"], 12


def tiny_model(seed: int = 0, dropout: float = 0.1, num_labels: int = 2):
    from transformers import BertForSequenceClassification

    torch.manual_seed(seed)
    config = tiny_bert_config(max_position_embeddings=64, hidden_dropout_prob=dropout,
                              attention_probs_dropout_prob=dropout, num_labels=num_labels)
    return BertForSequenceClassification(config)


def tiny_dataset(n: int = 64, seed: int = 0):
    from datasets import Dataset

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (n, SEQ), generator=g)
    ids[:, 0] = 2  # [CLS]
    labels = (ids[:, 1] % 2).tolist()  # learnable from one token
    return Dataset.from_dict({"input_ids": ids.tolist(), "labels": labels, "idx": list(range(n))})


def collate(examples: list[dict]) -> dict:
    input_ids = torch.tensor([e["input_ids"] for e in examples])
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "labels": torch.tensor([e["labels"] for e in examples]),
        "idx": [e["idx"] for e in examples],  # not a model input: the loss_fn leaves it out
    }


def loss_fn(model, batch):
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    return out.loss


def run(out_dir, **config) -> torch.nn.Module:
    """Train the dropout-free tiny model with a global batch of 16 for 6 steps; return it."""
    cfg = TrainConfig(**{"batch_size": 16, "max_steps": 6, "lr": 5e-3, "log_every": 0, "seed": 7, **config})
    model = tiny_model(dropout=0.0)
    trainer = Trainer(model, cfg, tiny_dataset(64), collate, loss_fn, out_dir=out_dir, desc="ddp")
    return trainer.train().model


if __name__ == "__main__":
    from accelerate import PartialState
    from safetensors.torch import save_file

    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    model = run(out / "run")
    state = PartialState()
    if state.is_main_process:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "final.safetensors"))
        (out / "world_size.txt").write_text(str(state.num_processes))
    state.wait_for_everyone()
