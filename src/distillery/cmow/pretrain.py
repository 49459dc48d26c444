"""General distillation of a CMOW/CBOW-Hybrid encoder on unlabelled text (§2.2).

Masked LM on a corpus (15 % of tokens chosen, 80/10/10), per-token representations h_i → a linear
MLM head, with the teacher reading the same masked blocks:

    L = (1 − w) · CE(MLM) + w · KD      (w: kd_weight, the share of the distillation term in every method)

- a teacher **with** an MLM head (e.g. ``bert-base-uncased``): KD = soft cross-entropy against the
  teacher's MLM distribution at temperature T on the masked positions (the paper's);
- a teacher **without** one (the built-in MiniLM is a sentence encoder with no MLM head): KD = the
  teacher's last hidden state per real token, predicted from h_i through a learned linear projection
  (MSE, or 1 − cosine). This is our extension: the paper has no recipe for such a teacher.

The trained encoder initialises task students: ``distillery compress --method cmow --option init=<out>/model``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from distillery.cmow.modeling_cmow import CMOWConfig, CMOWForMaskedLM, checked_config
from distillery.cmow.options import CMOWOptions
from distillery.config import TrainConfig
from distillery.data.corpus import mlm_collator, mlm_dataset, read_corpus
from distillery.errors import DistilleryError
from distillery.folders import check_step_settings, claim, record, write_file
from distillery.modeling import load_checked, load_tokenizer
from distillery.teacher import resolve_teacher, teacher_config
from distillery.training.losses import kd_mix, soft_cross_entropy
from distillery.training.trainer import Trainer
from distillery.weights import record_weights
import distillery.distributed as distributed

logger = logging.getLogger("distillery")

HIDDEN_LOSSES = ("mse", "cosine")


def load_mlm_teacher(name: str):
    """(teacher, mlm_head or None, tokenizer): the teacher's base encoder, and its MLM head when the
    checkpoint has trained weights for one."""
    from transformers import AutoModelForMaskedLM

    path = resolve_teacher(name)
    tokenizer = load_tokenizer(path)
    model, info = load_checked(AutoModelForMaskedLM, path, f"teacher {name!r}", new_head=True)
    head = getattr(model, "cls", None) or getattr(model, "lm_head", None)
    head_names = ("cls.", "lm_head.")
    has_head = head is not None and not any(k.startswith(head_names) for k in info.get("missing_keys", []))
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, (head if has_head else None), tokenizer


def general_distillation_loss(teacher, teacher_head, kd_weight: float, temperature: float, projection: nn.Module | None,
                              hidden_loss: str = "mse"):
    """loss_fn for the trainer (batches from :func:`distillery.data.corpus.mlm_collator`)."""
    def loss_fn(model, batch):
        ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
        hidden = model.encoder.per_token(ids, mask.bool())  # (B, T, token_size)
        masked = labels != -100
        logits = model.mlm_head(model.head_dropout(hidden[masked]))  # only where a token is to be predicted
        mlm = F.cross_entropy(logits.float(), labels[masked])
        with torch.no_grad():
            t_hidden = teacher.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
        if teacher_head is not None:
            with torch.no_grad():
                t_logits = teacher_head(t_hidden[masked])
            kd = soft_cross_entropy(logits, t_logits, temperature=temperature)
        else:
            real = mask.bool()
            pred, target = projection(hidden[real]), t_hidden[real].float()
            kd = F.mse_loss(pred, target) if hidden_loss == "mse" else (1 - F.cosine_similarity(pred, target, dim=-1)).mean()
        return kd_mix(mlm, kd, kd_weight), {"mlm": float(mlm.detach()), "kd": float(kd.detach())}

    return loss_fn


def pretrain(
    corpus: list[str | Path],
    out: str | Path,
    *,
    teacher: str = "minilm",
    train: TrainConfig | None = None,
    max_lines: int | None = None,
    max_length: int = 128,
    kd_weight: float = 0.5,
    temperature: float = 1.0,
    hidden_loss: str = "mse",
    model_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    resume: bool = False,
    checkpoint_every: int = 200,
) -> Path:
    """Train a CMOWForMaskedLM by general distillation; save it (with the tokenizer) to ``out/model``
    and the run's facts to ``out/pretrain.json``. A checkpoint every ``checkpoint_every`` steps in
    ``out/checkpoints``; ``resume`` continues from the last one exactly (same batches, same masks)."""
    _check_settings(teacher, kd_weight, temperature, hidden_loss, model_options)
    texts = read_corpus(corpus, max_lines=max_lines)  # a bad corpus or --max-lines before the run folder is touched
    out = distributed.on_main(claim, Path(out), "cmow-pretrain", overwrite=overwrite, resume=resume, inputs=[teacher, *corpus])
    train = train or TrainConfig(epochs=1.0, batch_size=64, lr=5e-4, weight_decay=0.0, select_best=False)
    # a resume with other settings would continue from the checkpoint and record these in pretrain.json
    distributed.on_main(check_step_settings, out, {
        "teacher": teacher, "corpus": list(corpus), "max_lines": max_lines, "max_length": max_length,
        "kd_weight": kd_weight, "temperature": temperature, "hidden_loss": hidden_loss,
        "model_options": dict(model_options or {}), **dataclasses.asdict(train)}, resume)
    started = time.time()

    teacher_model, teacher_head, tokenizer = load_mlm_teacher(teacher)
    dataset = mlm_dataset(tokenizer, texts, max_length)
    config = CMOWConfig(vocab_size=teacher_model.config.vocab_size, pad_token_id=tokenizer.pad_token_id,
                        sep_token_id=tokenizer.sep_token_id, **(model_options or {}))
    torch.manual_seed(train.seed)  # the initial encoder and projection are part of a reproducible run
    student = CMOWForMaskedLM(config)
    projection = None
    if teacher_head is None:
        projection = nn.Linear(config.token_size, teacher_model.config.hidden_size)
    how = ("the teacher's MLM distribution (soft CE, T = %g)" % temperature if teacher_head is not None
           else f"the teacher's last hidden state through a learned projection ({hidden_loss}; the teacher has no MLM head)")
    logger.info("General distillation: %d lines → %d blocks of ≤ %d tokens; kd_weight = %g; KD on %s.",
                len(texts), len(dataset), max_length, kd_weight, how)
    trainer = Trainer(student, train, dataset, mlm_collator(tokenizer),
                      general_distillation_loss(teacher_model, teacher_head, kd_weight, temperature, projection, hidden_loss),
                      out_dir=out, resume=resume, extra_parameters=[projection] if projection is not None else (),
                      desc="cmow-pretrain", checkpoint_every=checkpoint_every)
    teacher_model.to(trainer.device)
    result = trainer.train()
    model = result.model.eval()
    if not distributed.is_main():  # under a launcher: trained here too, saved by the main process
        return out / "model"
    last = result.history[-1] if result.history else {}
    facts = {"teacher": teacher, "kd": "mlm-distribution" if teacher_head is not None else f"hidden-{hidden_loss}",
             "corpus": [str(p) for p in corpus], "lines": len(texts), "blocks": len(dataset), "max_length": max_length,
             "kd_weight": kd_weight, "temperature": temperature, "steps": result.global_step, "seconds": time.time() - started,
             "examples_per_s": result.examples_per_s, "last_loss": last.get("loss"), "last_parts": last.get("parts")}
    _save(out, model, tokenizer, facts)
    return out / "model"


def _check_settings(teacher: str, kd_weight: float, temperature: float, hidden_loss: str,
                    model_options: dict[str, Any] | None) -> None:
    """Refuse bad :func:`pretrain` settings before anything is written."""
    CMOWOptions.check_value("kd_weight", kd_weight)
    CMOWOptions.check_value("temperature", temperature)
    if hidden_loss not in HIDDEN_LOSSES:
        raise DistilleryError(f"hidden_loss must be one of {', '.join(HIDDEN_LOSSES)}, got {hidden_loss!r}.")
    # the encoder options the task recipe shares are checked as it checks them; the rest by CMOWConfig
    for key, value in (model_options or {}).items():
        CMOWOptions.check_value(key, value)  # a model option without a spec passes as it is
    # the model's own checks (its size among them): the teacher's config gives the vocabulary
    checked_config(vocab_size=teacher_config(teacher).vocab_size, **(model_options or {}))


def _save(out: Path, model: nn.Module, tokenizer, facts: dict[str, Any]) -> None:
    """The pretrained model and its tokenizer in ``out/model``, the run's facts in ``out/pretrain.json``;
    the checkpoints, no longer needed, removed."""
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    record_weights(out / "model")
    record(out / "model")
    write_file(out / "pretrain.json", json.dumps(facts, indent=2))
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
