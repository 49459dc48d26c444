"""AutoTinyBERT on an embedder (``--task embedding``, :mod:`distillery.kinds.embedding`): the task has no train split
and no labels of its own, so the rows read (the rewiring's importance scores, the search's held-out rows) are the
student's training texts with the teacher's vectors, and a candidate is scored by the embedding objective itself:
−(1 − cos + MSE) between its unit sentence vectors (its last hidden states through the one-shot projection, mean
pooled) and the teacher's, on held-out texts. The super-net's one-shot phase distils the last hidden states and
attention scores as for every task (mean pooling is linear: matched token states give the matched vector). A
sub-network narrower than the teacher is further trained through a projection onto the teacher's width, started
from the one-shot projection's slice and used in the loss only (``TaskKind.projects_width``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from distillery.autotinybert.space import Arch
from distillery.kinds.embedding import embedding_distance, sentence_vectors
from distillery.training.losses import HiddenProjection, distillation_loss, pretrained_distillation_loss


def training_rows(ctx, opts):
    """The rows the rewiring and the search read: the train split, or where the task's own is empty (an embedder
    learns from the texts given only) the student's training rows, with the teacher's outputs."""
    if len(ctx.task_data.train):
        return ctx.task_data.train
    return ctx.distillation_train(opts.train_examples == "all", opts.augment or 0)


def embedding_evaluator(supernet, projection, rows, collate_fn):
    """A candidate's score on ``rows`` (held-out texts with ``teacher_logits``): −the mean embedding distance."""
    batches = list(DataLoader(rows, batch_size=64, collate_fn=collate_fn))

    @torch.no_grad()
    def evaluate(arch: Arch) -> float:
        supernet.eval()
        total = 0.0
        for b in batches:
            h = supernet.encode(b["input_ids"], b["attention_mask"], b.get("token_type_ids"), arch)[0]
            h = F.linear(h, projection.weight[:, : arch.hidden], projection.bias)  # onto the teacher's width
            vectors = sentence_vectors({"last_hidden_state": h}, b)
            total += float(embedding_distance(vectors, b["teacher_logits"])) * len(vectors) / len(rows)
        return -total

    return evaluate


def further_training_loss(kind, teacher, student, projection, kd_weight: float, temperature: float,
                          hidden_weight: float = 0.0, hidden_layers: list[int] | None = None,
                          attention_weight: float = 0.0):
    """The further training's loss_fn and the parameters trained beside the student: the kind's distillation
    loss (with the hidden-state and attention terms onto teacher layers ``hidden_layers``: a sub-network of the
    teacher's width, :func:`distillery.autotinybert.further.further_defaults`), or for an embedder narrower than
    the teacher the same without them, through a projection of its last hidden states (from the one-shot
    projection's slice)."""
    width, teacher_width = student.config.hidden_size, teacher.config.hidden_size
    if not kind.projects_width or width == teacher_width:
        return distillation_loss(kind, teacher, kd_weight, temperature, hidden_weight, hidden_layers,
                                 attention_weight), []
    onto = HiddenProjection(width, teacher_width)
    with torch.no_grad():
        onto.linear.weight.copy_(projection.weight[:, :width])
        onto.linear.bias.copy_(projection.bias)
    return pretrained_distillation_loss(kind, teacher, kd_weight, temperature, output_projection=onto), [onto]
