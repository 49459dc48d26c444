"""Extractive question answering (SQuAD): the answer is a span of the context, predicted as start and end logits
over each window's tokens and scored by exact match and F1 (percentages)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch.nn.functional as F
from torch import Tensor

from distillery.errors import DistilleryError
from distillery.kinds.base import TaskKind, output_field
from distillery.metrics import squad_metrics
from distillery.modeling import QUESTION_ANSWERING_HEAD

SQUAD_V2_METRICS = ("exact_match", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1")
LOGIT_PAD = -1e4  # fills QA logits past a window's end; postprocess_squad never reads them


def span_logits(outputs: Any) -> tuple[Tensor, Tensor]:
    """``(start_logits, end_logits)`` of a QA output, a dict, or a pair of tensors."""
    if isinstance(outputs, (tuple, list)) and len(outputs) == 2 and all(isinstance(x, Tensor) for x in outputs):
        return outputs[0], outputs[1]
    start, end = output_field(outputs, "start_logits"), output_field(outputs, "end_logits")
    if start is None or end is None:
        raise ValueError(
            f"expected start and end logits (an output with start_logits/end_logits or a pair), "
            f"got {type(outputs).__name__}."
        )
    return start, end


class QuestionAnswering(TaskKind):
    name = "qa"
    head = QUESTION_ANSWERING_HEAD
    pipeline_tag = "question-answering"
    metrics = SQUAD_V2_METRICS
    main_metrics = ("exact_match", "f1")  # SQuAD v2's HasAns_/NoAns_ parts exist only where it has such questions
    # A SQuAD answer is a span of its context, which a new row does not have; its teacher's outputs are a
    # distribution over each window's positions, not one vector a row.
    takes_new_rows = False
    caches_teacher_outputs = False  # its distillation term runs the teacher (a pretrained student's carry reads it)
    augments_by_default = False
    pooled_output = False
    needs_offsets = True
    scores_in_percent = True
    quick_train_limit = 2000
    max_lengths = {"quick": 256, "full": 384}
    doc_strides = {"quick": 96, "full": 128}
    quick_teacher_lr = 1e-4

    def head_words(self, task) -> str:
        return "answer spans"

    def raw_features(self, task):
        import datasets  # here: see distillery.kinds.base

        return datasets.Features(
            {
                "id": datasets.Value("string"),
                "title": datasets.Value("string"),
                "context": datasets.Value("string"),
                "question": datasets.Value("string"),
                "answers": {
                    "text": datasets.List(datasets.Value("string")),
                    "answer_start": datasets.List(datasets.Value("int32")),
                },
            }
        )

    def check_encoding(self, tokenizer, pair_mode):
        if pair_mode == "separate":
            raise DistilleryError("SQuAD cannot be encoded with pair_mode='separate'; use the joint encoding.")
        if not getattr(tokenizer, "is_fast", False):
            raise DistilleryError(
                f"SQuAD needs a fast tokenizer (character offsets); {type(tokenizer).__name__} is not one."
            )

    def encode(self, task, raw, tokenizer, data_config, pair_mode, split_name, train):
        # here, not at the top: distillery.kinds.base says why
        from distillery.data.encode import encode_squad_eval, encode_squad_train

        encode = encode_squad_train if train else encode_squad_eval
        return encode(raw, tokenizer, data_config.max_length, data_config.doc_stride)

    def task_loss(self, outputs, batch, reduction="mean"):
        """``½ (CE(start_logits, start_positions) + CE(end_logits, end_positions))``, positions clamped into
        ``[0, L]`` and ``L`` ignored (answers cut off by a window do not count)."""
        start_logits, end_logits = span_logits(outputs)
        if "start_positions" not in batch or "end_positions" not in batch:
            raise ValueError("a QA batch needs start_positions and end_positions.")
        n_positions = start_logits.shape[-1]
        losses = []
        for logits, key in ((start_logits, "start_positions"), (end_logits, "end_positions")):
            positions = batch[key].reshape(-1).long().clamp(0, n_positions)
            losses.append(F.cross_entropy(logits.float(), positions, ignore_index=n_positions, reduction=reduction))
        return (losses[0] + losses[1]) / 2

    def distillation_term(self, student_out, teacher_out, temperature, distribution_loss):
        """``½ (loss(s_start, t_start, T) + loss(s_end, t_end, T))`` over each window's positions."""
        s_start, s_end = span_logits(student_out)
        t_start, t_end = span_logits(teacher_out)
        return (distribution_loss(s_start, t_start, temperature) + distribution_loss(s_end, t_end, temperature)) / 2

    def predictions(self, chunks, restore, task):
        """(start_logits, end_logits), each (windows, longest window), padded with :data:`LOGIT_PAD`."""
        longest = max(s.shape[1] for s, _ in chunks)
        pad = lambda a: np.pad(a, ((0, 0), (0, longest - a.shape[1])), constant_values=LOGIT_PAD)  # noqa: E731
        return (restore(np.concatenate([pad(s) for s, _ in chunks])), restore(np.concatenate([pad(e) for _, e in chunks])))

    def scores(self, task_data, predictions):
        from distillery.data.encode import postprocess_squad  # here: see encode

        start_logits, end_logits = predictions
        cfg, version_2 = task_data.data_config, task_data.task.squad_version == 2
        answers = postprocess_squad(
            task_data.dev_examples,
            task_data.dev,
            start_logits,
            end_logits,
            n_best=cfg.n_best,
            max_answer_length=cfg.max_answer_length,
            version_2=version_2,
            null_score_threshold=cfg.null_score_threshold,
        )
        return squad_metrics(answers, task_data.dev_examples, version_2=version_2)
