"""Sentence (and sentence-pair) regression: one score a row, scored by Pearson and Spearman correlation."""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F
from torch import Tensor

from distillery.kinds.base import logits_of
from distillery.kinds.sentence import SentenceKind
from distillery.modeling import SEQUENCE_HEAD


def mse(student_pred: Tensor, target: Tensor) -> Tensor:
    """Mean squared error for regression distillation: ``mean_i (s_i − t_i)²``.

    ``(N, 1)`` predictions and ``(N,)`` targets (or the reverse) are compared element by element.
    """
    if student_pred.shape != target.shape:
        if student_pred.numel() != target.numel():
            raise ValueError(
                f"predictions {tuple(student_pred.shape)} and targets {tuple(target.shape)} differ in size."
            )
        target = target.reshape(student_pred.shape)
    return F.mse_loss(student_pred.float(), target.float())


class Regression(SentenceKind):
    name = "regression"
    head = SEQUENCE_HEAD
    pipeline_tag = "text-classification"
    metrics = ("pearson", "spearman")
    main_metrics = metrics
    label_dtype = "float32"
    static_head = "ridge"

    def takes_outputs(self, outputs: int) -> bool:
        return outputs == 1

    def num_labels(self, task) -> int:
        return 1

    def head_config(self, task) -> dict:
        return {"num_labels": 1, "problem_type": "regression"}

    def head_words(self, task) -> str:
        return "a regression head"

    def _label_loss(self, logits: Tensor, labels: Tensor, reduction: str) -> Tensor:
        return F.mse_loss(logits.reshape(-1).float(), labels.reshape(-1).float(), reduction=reduction)

    def distillation_term(self, student_out, teacher_out, temperature, distribution_loss):
        """:func:`mse` between the predictions: a score has no distribution to soften (no temperature)."""
        return mse(logits_of(student_out), logits_of(teacher_out))

    def distillation_gap(self, student_out, teacher_out, temperature, kl):
        return {}  # the distillation term (MSE) already is 0 at a match

    def cached_teacher_outputs(self, logits):
        return super().cached_teacher_outputs(logits.squeeze(-1))

    def predictions(self, chunks, restore, task):
        logits = super().predictions(chunks, restore, task)
        return logits.reshape(len(logits), -1)[:, 0]  # (N, 1) -> (N,)

    def _scored(self, predictions):
        return predictions

    def chance(self, task_data):
        return np.zeros(len(task_data.labels("dev"))), "a constant"

    def placeholder_label(self):
        return 0.0

    def teacher_labels(self, logits):
        return logits[:, 0]

    def fit_static_head(self, features: np.ndarray, labels: np.ndarray, seed: int):
        """Standardised features, then ridge regression (a scikit-learn pipeline)."""
        from sklearn.linear_model import Ridge
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        return make_pipeline(StandardScaler(), Ridge(alpha=1.0)).fit(features, labels.astype(np.float64))

    def static_head_weights(self, coef, bias, estimator, num_labels, absent):
        return coef, bias
