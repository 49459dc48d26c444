"""What the sentence kinds (classification, regression) share: a model that reads a sentence (or a pair) and
predicts one ``logits`` vector for it."""

from __future__ import annotations

import numpy as np
from torch import Tensor

from distillery.errors import DistilleryError
from distillery.kinds.base import TaskKind, logits_of
from distillery.metrics import compute_metrics


class SentenceKind(TaskKind):
    """A kind whose model reads a sentence (or a pair) and predicts one ``logits`` vector for it."""

    def encode(self, task, raw, tokenizer, data_config, pair_mode, split_name, train):
        from distillery.data.encode import encode_rows  # here, not at the top: distillery.kinds.base says why

        return encode_rows(task, raw, tokenizer, data_config.max_length, pair_mode, split_name)

    def task_loss(self, outputs, batch, reduction="mean"):
        if "labels" not in batch:
            raise ValueError(f"a {self.name} batch needs labels.")
        return self._label_loss(logits_of(outputs), batch["labels"], reduction)

    def _label_loss(self, logits: Tensor, labels: Tensor, reduction: str) -> Tensor:
        raise NotImplementedError

    def predictions(self, chunks, restore, task):
        logits = restore(np.concatenate([chunk[0] for chunk in chunks]))
        outputs = 1 if logits.ndim == 1 else logits.shape[-1]
        needed = task.num_labels
        if outputs != needed:  # argmax over 3 logits, or the first of 2 as a score, would score silently wrong
            raise DistilleryError(
                f"The model has {outputs} output{'s' if outputs != 1 else ''} but task {task.name} ({task.kind}) needs "
                f"{needed}: its head does not match the task.")
        return logits

    def scores(self, task_data, predictions):
        return compute_metrics(task_data.task, self._scored(predictions), task_data.labels("dev"))

    def _scored(self, predictions: np.ndarray) -> np.ndarray:
        """What the metrics compare with the labels: a class id or a score a row."""
        raise NotImplementedError
