"""Task-agnostic pre-training of the super-network on a text corpus (the paper's one-shot learning of its
SuperPLM, KD setting), and the task run's use of what it writes.

`distillery autotinybert pretrain` cuts a super-net from the teacher's *pre-trained* encoder (``minilm``,
``mpnet-base`` or the checkpoint a task teacher is fine-tuned from; never a task-fine-tuned one: the
paper pre-trains before any task, so one super-net serves every task) and trains it by Algorithm 1 on
the corpus with the one-shot objective of :mod:`distillery.autotinybert.oneshot`: per step the largest,
the smallest and M − 2 random sub-networks (the sandwich rule, as the task phase), each distilled from
the teacher's last hidden state (MSE through a shared projection) and its last layer's pre-softmax
attention scores (MSE, head j against head j), the first stage of TinyBERT with the last layer only,
as the paper does. There is no prediction term: the encoder has no task head.

A task run given the folder (``--option supernet=FOLDER``) puts this task teacher's pooler and head on
it (:func:`for_task`) and, by default (``task_phase``), trains it one-shot on the task before the search:
the pre-trained super-net copies the base encoder, not the fine-tuned one whose hidden states the
further training distils, and its shared pooler and head were never trained on its representation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import time
from pathlib import Path

from distillery.autotinybert.convert import convert_teacher
from distillery.autotinybert.oneshot import (Targets, kd_loss, load_projection, load_supernet, make_projection,
                                             one_shot_loss, save_supernet, teacher_targets)
from distillery.autotinybert.options import AutoTinyBertOptions
from distillery.autotinybert.supernet import SuperNet
from distillery.config import TrainConfig
from distillery.data.corpus import mlm_dataset, read_corpus
from distillery.data.encode import make_collate
from distillery.errors import DistilleryError
from distillery.folders import check_step_settings, claim
from distillery.modeling import load_checked, load_tokenizer
from distillery.runtime import weights_digest
from distillery.teacher import resolve_teacher, teacher_identity
from distillery.training.trainer import Trainer
import distillery.distributed as distributed

logger = logging.getLogger("distillery")

PRETRAINED = "corpus"  # supernet.json's ``trained_on`` for a super-net pre-trained here
TASK_HEADS = ("ForSequenceClassification", "ForQuestionAnswering", "ForTokenClassification", "ForMultipleChoice")


def encoder_digest(encoder) -> str:
    """A short hash of an encoder's weights, as the bare encoder names them and without its pooler (the super-net
    takes its pooler from the task teacher): a super-net records the encoder it was cut from, and a task run compares
    it with the one its teacher is tuned from. The same for a checkpoint saved with a task head and for its encoder
    saved alone, which its files (and :func:`distillery.teacher.teacher_identity`) tell apart."""
    return weights_digest(encoder, leave_out=("pooler.",))[:16]


def load_encoder(teacher: str):
    """(the encoder of ``teacher``'s checkpoint, its loading info): a task head it was saved with is left behind."""
    from transformers import AutoModel

    model, info = load_checked(AutoModel, resolve_teacher(teacher), f"teacher {teacher!r}", new_head=True)
    return model.eval(), info


def files_digest(name: str) -> str:
    """What a super-net pre-trained before issue 52 recorded of its teacher: a hash of its files
    (:func:`distillery.teacher.teacher_identity`), another for the same encoder saved with or without a head."""
    return hashlib.sha256(json.dumps(teacher_identity(name), sort_keys=True).encode()).hexdigest()[:16]


def pretrain_supernet(corpus: list, out, *, teacher: str = "minilm", strategy: str = "head-dims", train=None,
                      samples: int = 3, attention_weight: float = 1.0, max_lines: int | None = None,
                      max_length: int = 128, overwrite: bool = False, resume: bool = False,
                      checkpoint_every: int = 200) -> Path:
    """Algorithm 1 on a text corpus, KD from ``teacher``'s pre-trained encoder; the super-net saved to
    ``out/supernet`` with what it was trained from in its ``supernet.json``. A checkpoint every
    ``checkpoint_every`` steps; ``resume`` continues exactly (same batches, same sub-networks)."""
    # every check before the run folder is touched: the recipe's own of these settings, the corpus, the teacher
    AutoTinyBertOptions.check_value("strategy", strategy)
    AutoTinyBertOptions.check_value("samples", samples)
    if not attention_weight >= 0:
        raise DistilleryError(f"--attention-weight must be 0 or more, got {attention_weight}.")
    texts = read_corpus(corpus, max_lines=max_lines)
    path = resolve_teacher(teacher)
    out = distributed.on_main(claim, Path(out), "supernet", overwrite=overwrite, resume=resume, inputs=[teacher, *corpus])
    train = train or TrainConfig(epochs=1.0, batch_size=32, lr=1e-4, warmup_ratio=0.1, select_best=False)
    # a resume with other settings would continue from the checkpoint and record these in supernet.json
    distributed.on_main(check_step_settings, out, {
        "teacher": teacher, "corpus": list(corpus), "strategy": strategy, "samples": samples,
        "attention_weight": attention_weight, "max_lines": max_lines, "max_length": max_length,
        **dataclasses.asdict(train)}, resume)
    started = time.time()
    tokenizer = load_tokenizer(path)
    teacher_model, loading = load_encoder(teacher)
    warn_of_a_head(teacher, teacher_model, loading)
    for p in teacher_model.parameters():
        p.requires_grad_(False)
    supernet = SuperNet.from_teacher(teacher_model, strategy)
    projection = make_projection(supernet, teacher_model.config.hidden_size)
    dataset, held = held_out_split(mlm_dataset(tokenizer, texts, max_length))
    logger.info("Super-net pre-training: %d lines → %d blocks of ≤ %d tokens (%d more held out); %d sub-networks a step.",
                len(texts), len(dataset), max_length, len(held), samples)
    held_out = HeldOut(teacher_model, held, make_collate(tokenizer), supernet.space, attention_weight)
    before = held_out.losses(supernet, projection)
    trainer = Trainer(supernet, train, dataset, make_collate(tokenizer),
                      one_shot_loss(teacher_model, projection, samples, train.seed, attention_weight),
                      out_dir=out, resume=resume, extra_parameters=[projection], desc="supernet-pretrain",
                      checkpoint_every=checkpoint_every)
    teacher_model.to(trainer.device)
    result = trainer.train()
    facts = {"trained_on": PRETRAINED, "teacher": teacher, "encoder_digest": encoder_digest(teacher_model),
             "layers": supernet.config.num_hidden_layers, "hidden": supernet.config.hidden_size, "corpus": [str(p) for p in corpus],
             "lines": len(texts), "blocks": len(dataset), "held_out_blocks": len(held), "max_length": max_length,
             "held_out": held_out.compare(before, result.model, projection), "steps": result.global_step,
             "batch_size": train.batch_size, "lr": train.lr, "seed": train.seed, "samples": samples,
             "sandwich": True, "attention_weight": attention_weight, "seconds": round(time.time() - started, 1),
             "loss": [[e["step"], e["loss"]] for e in result.history]}
    if distributed.is_main():  # under a launcher every process trained it; one saves it
        save_supernet(result.model, projection, out / "supernet", tokenizer, facts)
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
    return out / "supernet"


def warn_of_a_head(teacher: str, encoder, loading: dict) -> None:
    """Say what becomes of a head the teacher was saved with (dropped), and that a task head's encoder is fine-tuned."""
    dropped = sorted({key.split(".")[0] + ".*" for key in loading.get("unexpected_keys", ())})
    what = f"its head's weights ({', '.join(dropped)}) are dropped" if dropped else "its head is not used"
    task_heads = [a for a in getattr(encoder.config, "architectures", None) or () if a.endswith(TASK_HEADS)]
    if task_heads:
        logger.warning("Teacher %s was saved with a task head (%s): %s, since pre-training needs only the encoder. "
                       "That encoder is fine-tuned, so the super-net learns that task's features; for one that serves "
                       "every task, give the checkpoint tasks are fine-tuned from.", teacher, ", ".join(task_heads), what)
    elif dropped:  # a pre-training head (a masked LM's): the encoder is the pre-trained one
        logger.info("Teacher %s: %s, since pre-training needs only the encoder.", teacher, what)


# Blocks held out of training to judge it: the training loss mixes sub-networks drawn at random and cannot show
# whether a fixed one improves; a tenth of the corpus at most
HELD_OUT_BLOCKS = 64


def held_out_split(dataset, blocks: int = HELD_OUT_BLOCKS):
    """(training blocks, held-out blocks): the last ``blocks`` blocks, a tenth of them at most, are held out."""
    n = min(blocks, len(dataset) // 10)
    return dataset.select(range(len(dataset) - n)), dataset.select(range(len(dataset) - n, len(dataset)))


class HeldOut:
    """The one-shot objective (hidden + w · attention MSE against the teacher) on the held-out blocks, for
    three fixed sub-networks: the smallest, one drawn with seed 0, the largest."""

    def __init__(self, teacher, blocks, collate, space, attention_weight: float):
        import random

        from torch.utils.data import DataLoader

        self.batches = [(b, teacher_targets(teacher, b)) for b in DataLoader(blocks, batch_size=16, collate_fn=collate)]
        self.archs = {"smallest": space.smallest(), "sampled": space.sample(random.Random(0)), "largest": space.full()}
        self.attention_weight = attention_weight

    def losses(self, supernet, projection) -> dict[str, float]:
        import torch

        device, was_training = next(supernet.parameters()).device, supernet.training
        supernet.eval()  # no dropout: the same number before and after, and no draw from the training's RNG
        sums = dict.fromkeys(self.archs, 0.0)
        count = sum(b["input_ids"].shape[0] for b, _ in self.batches)
        with torch.no_grad():
            for batch, targets in self.batches:
                batch = {k: v.to(device) for k, v in batch.items()}
                targets = Targets(targets.hidden.to(device), targets.scores.to(device))
                for name, arch in self.archs.items():
                    terms = kd_loss(supernet, projection.to(device), arch, batch, targets)
                    sums[name] += float(terms.total(self.attention_weight)) * batch["input_ids"].shape[0] / count
        supernet.train(was_training)
        return sums

    def compare(self, before: dict[str, float], supernet, projection) -> dict | None:
        if not self.batches:
            return None
        after = self.losses(supernet, projection)
        return {name: {"arch": str(arch), "before": before[name], "after": after[name]} for name, arch in self.archs.items()}


def supernet_facts(folder) -> dict:
    """The ``supernet.json`` of a super-net folder (see :func:`distillery.autotinybert.oneshot.load_supernet`)."""
    path = Path(folder) / "supernet.json"
    if not path.is_file():
        raise DistilleryError(f"Option supernet: {folder} is not a super-net folder (no supernet.json); make one with "
                              f"`distillery autotinybert pretrain`.")
    try:
        facts = json.loads(path.read_text())
    except (OSError, ValueError):
        facts = None
    if not isinstance(facts, dict):
        raise DistilleryError(f"Option supernet: {path} is not the JSON object a super-net folder holds; pre-train the "
                              f"super-net again.")
    return facts


def is_pretrained(folder) -> bool:
    return supernet_facts(folder).get("trained_on") == PRETRAINED


def check_teacher(folder, teacher_name: str) -> None:
    """Refuse, in one sentence, a pre-trained super-net cut from another encoder than ``teacher_name``
    (the checkpoint this run fine-tunes its teacher from), before that fine-tuning's minutes."""
    facts = supernet_facts(folder)
    if "encoder_digest" in facts:  # the encoder's weights: the same teacher saved with a task head or without
        same = facts["encoder_digest"] == encoder_digest(load_encoder(teacher_name)[0])
    else:  # a super-net pre-trained before issue 52 recorded its teacher's files
        same = facts.get("teacher_digest") == files_digest(teacher_name)
    if not same:
        raise DistilleryError(f"Option supernet: {folder} was pre-trained from teacher {facts.get('teacher')!r} "
                              f"({facts.get('layers', '?')} layers of width {facts.get('hidden', '?')}), not from "
                              f"{teacher_name!r} that this run's teacher is fine-tuned from; pre-train one from it with "
                              f"`distillery autotinybert pretrain --teacher {teacher_name}`.")


def for_task(folder, teacher, teacher_name: str | None, strategy: str):
    """(super-net, projection, note): the pre-trained super-net at ``folder`` with the task teacher's
    pooler and head (:func:`distillery.autotinybert.convert.convert_teacher`), refused in one sentence when
    it was cut from another encoder. ``teacher_name``: the checkpoint the task teacher was fine-tuned
    from (None when it was given fine-tuned: only its shape can be compared then)."""
    facts = supernet_facts(folder)
    pretrained, projection = load_supernet(folder), load_projection(folder)
    task_bert, head, kind = convert_teacher(teacher)
    encoder = {k: v for k, v in pretrained.bert.state_dict().items() if not k.startswith("pooler.")}
    ours = {k: v for k, v in task_bert.state_dict().items() if not k.startswith("pooler.")}
    shapes = lambda d: {k: tuple(v.shape) for k, v in d.items()}  # noqa: E731
    if shapes(encoder) != shapes(ours) or projection is None or projection.out_features != teacher.config.hidden_size:
        c = pretrained.config
        raise DistilleryError(f"Option supernet: {folder} was pre-trained from {facts.get('teacher', 'another teacher')} "
                              f"({c.num_hidden_layers} layers of width {c.hidden_size}), not from an encoder of this "
                              f"run's teacher's shape ({teacher.config.num_hidden_layers} layers of width "
                              f"{teacher.config.hidden_size}); pre-train one from it with `distillery autotinybert pretrain`.")
    if teacher_name is not None:
        check_teacher(folder, teacher_name)
    if pretrained.space.strategy != strategy:
        raise DistilleryError(f"Option supernet: {folder} uses the {pretrained.space.strategy} strategy, not {strategy}.")
    # the encoder from the corpus, the pooler and head from the task teacher (a sliced pooler feeds the head)
    task_bert.load_state_dict({**task_bert.state_dict(), **encoder})
    note = (f"Super-net: pre-trained on {facts.get('lines', '?')} corpus lines for {facts.get('steps', '?')} steps "
            f"from {facts.get('teacher')} ({folder})" + ("" if teacher_name else "; the run's teacher was given "
            "fine-tuned, so only its shape was checked against the super-net's") + ".")
    return SuperNet(task_bert, head, kind, strategy), projection, note
