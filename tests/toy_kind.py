"""A toy task kind for tests/test_kind_registry.py: a score a sentence, as regression predicts it, learnt with the
mean absolute error on the labels and on the teacher's score. It counts its calls, so a test can tell that the
run asked it."""

from collections import Counter

import torch.nn.functional as F

from distillery.kinds.base import logits_of
from distillery.kinds.regression import Regression

CALLS: Counter = Counter()


class AbsoluteScore(Regression):
    name = "toy"

    def head_words(self, task):
        return "a toy score head"

    def _label_loss(self, logits, labels, reduction):
        CALLS["task_loss"] += 1
        return F.l1_loss(logits.reshape(-1).float(), labels.reshape(-1).float(), reduction=reduction)

    def distillation_term(self, student_out, teacher_out, temperature, distribution_loss):
        CALLS["distillation_term"] += 1
        return F.l1_loss(logits_of(student_out).reshape(-1).float(), logits_of(teacher_out).reshape(-1).float())

    def predictions(self, chunks, restore, task):
        CALLS["predictions"] += 1
        return super().predictions(chunks, restore, task)
