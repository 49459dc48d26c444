"""A toy task kind for tests/test_kind_registry.py: a score a sentence (regression's head and metrics) learnt with
the mean absolute error, on the labels and on the teacher's score. It counts its calls, so a test can tell that
the run asked it."""

from collections import Counter

import numpy as np
import torch.nn.functional as F

from distillery.kinds.base import logits_of
from distillery.kinds.sentence import SentenceKind
from distillery.modeling import SEQUENCE_HEAD

CALLS: Counter = Counter()


class AbsoluteScore(SentenceKind):
    name = "toy"
    head = SEQUENCE_HEAD
    pipeline_tag = "text-classification"
    metrics = ("pearson", "spearman")
    main_metrics = metrics
    label_dtype = "float32"

    def num_labels(self, task):
        return 1

    def head_config(self, task):
        return {"num_labels": 1, "problem_type": "regression"}

    def head_words(self, task):
        return "a toy score head"

    def _label_loss(self, logits, labels, reduction):
        CALLS["task_loss"] += 1
        return F.l1_loss(logits.reshape(-1).float(), labels.reshape(-1).float(), reduction=reduction)

    def distillation_term(self, student_out, teacher_out, temperature, distribution_loss):
        CALLS["distillation_term"] += 1
        return F.l1_loss(logits_of(student_out).reshape(-1).float(), logits_of(teacher_out).reshape(-1).float())

    def distillation_gap(self, student_out, teacher_out, temperature, kl):
        return {}

    def cached_teacher_outputs(self, logits):
        return super().cached_teacher_outputs(logits.squeeze(-1))

    def predictions(self, chunks, restore, task):
        CALLS["predictions"] += 1
        return super().predictions(chunks, restore, task)[:, 0]

    def _scored(self, predictions):
        return predictions

    def chance(self, task_data):
        return np.zeros(len(task_data.labels("dev"))), "a constant"

    def placeholder_label(self):
        return 0.0

    def teacher_labels(self, logits):
        return logits[:, 0]
