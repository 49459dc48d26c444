"""Sentence (and sentence-pair) classification: one class of a fixed set a row, scored by accuracy, F1, MCC."""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F
from torch import Tensor

from distillery.errors import DistilleryError
from distillery.kinds.base import logits_of
from distillery.kinds.sentence import SentenceKind
from distillery.modeling import SEQUENCE_HEAD


class Classification(SentenceKind):
    name = "classification"
    head = SEQUENCE_HEAD
    pipeline_tag = "text-classification"
    metrics = ("accuracy", "f1", "macro_f1", "mcc")
    main_metrics = metrics
    label_dtype = "int64"
    static_head = "logistic-regression"
    softened_outputs = True

    def num_labels(self, task) -> int:
        return len(task.labels) if task.labels else 0

    def takes_outputs(self, outputs: int) -> bool:
        return outputs != 1  # one output is a regressor, as transformers reads num_labels 1

    def head_config(self, task) -> dict:
        names = list(task.class_names)
        return {
            "num_labels": len(names),
            "problem_type": "single_label_classification",
            "id2label": dict(enumerate(names)),
            "label2id": {name: i for i, name in enumerate(names)},
        }

    def head_words(self, task) -> str:
        return f"labels {', '.join(task.class_names)}"

    def _label_loss(self, logits: Tensor, labels: Tensor, reduction: str) -> Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1).long(), reduction=reduction)

    def distillation_term(self, student_out, teacher_out, temperature, distribution_loss):
        return distribution_loss(logits_of(student_out), logits_of(teacher_out), temperature)

    def _scored(self, predictions):
        return predictions.argmax(axis=-1)

    def chance(self, task_data):
        train = task_data.labels("train").astype(int)
        majority = int(np.bincount(train).argmax()) if train.size else 0
        return np.full(len(task_data.labels("dev")), majority), f"always the most frequent class ({majority})"

    def placeholder_label(self):
        return 0

    def teacher_labels(self, logits):
        return logits.argmax(-1)

    def fit_static_head(self, features: np.ndarray, labels: np.ndarray, seed: int):
        """Standardised features, then logistic regression (a scikit-learn pipeline)."""
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        if len(np.unique(labels)) < 2:
            raise DistilleryError("The train split holds one class only, so no logistic-regression head can be "
                                  "fitted for the static-embedding baseline.")
        head = LogisticRegression(C=1.0, max_iter=2000, random_state=seed)
        return make_pipeline(StandardScaler(), head).fit(features, labels.astype(np.int64))

    def static_head_weights(self, coef: np.ndarray, bias: np.ndarray, estimator, num_labels: int, absent: float):
        """The fitted classes' rows of a (K, F) weight and (K,) bias; binary logistic regression has one decision
        function d, and logits [0, d] give the same argmax and softmax. A class the train split lacks gets the
        logit ``absent``."""
        weight = np.zeros((num_labels, coef.shape[1]))
        full_bias = np.full(num_labels, absent)
        classes = estimator.classes_.astype(np.int64)
        if len(classes) == 2 and len(coef) == 1:
            weight[classes[1]], full_bias[classes[1]], full_bias[classes[0]] = coef[0], bias[0], 0.0
        else:
            weight[classes], full_bias[classes] = coef, bias
        return weight, full_bias
