"""Token classification (named-entity recognition, part-of-speech tagging): one tag a word, predicted as one
``logits`` vector a sub-word token and scored on words by seqeval's entity precision, recall and F1.

Labels sit on words, not sub-words, as transformers' own token-classification example puts them: the first
sub-word of each word carries the word's tag; the word's other sub-words, the special tokens and padding carry
-100 and are left out of the loss, the distillation term and the metrics. ``data.label_all_subwords`` labels the
other sub-words of a training sentence too (``B-X`` continues as ``I-X``); a dev sentence is always scored on its
first sub-words. The encoded rows say which positions are first sub-words (``word_mask``), so a row without gold
tags still has its words. A sentence longer than the model's length is never silently cut: its words past the
last token are scored as predicted ``O`` (the encoding logs how many there are).

The teacher runs beside the student during distillation (``takes_new_rows`` is False): its outputs are one
distribution a token, not one vector a row, so the per-row cache of teacher logits
(``MethodContext.teacher_outputs``) and the teacher's labels for new rows (``--augment``, ``--unlabeled-file``)
do not apply to it yet.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from distillery.errors import DistilleryError
from distillery.kinds.base import TaskKind, logits_of
from distillery.metrics import ENTITY_METRICS, OUTSIDE, entity_metrics
from distillery.modeling import TOKEN_HEAD

IGNORED = -100  # the label of a position that is not a word's first sub-word (transformers' ignore index)


def word_positions(batch) -> Tensor:
    """The positions of a batch that are words' first sub-words, (B, L) bool: its ``word_mask`` where it has one
    (rows without gold tags have words too), else its labels that are not -100."""
    if "word_mask" in batch:
        return batch["word_mask"].bool()
    if "labels" in batch:
        return batch["labels"] != IGNORED
    raise ValueError("a token-classification batch needs word_mask or labels to know its words.")


class TokenClassification(TaskKind):
    name = "token_classification"
    head = TOKEN_HEAD
    pipeline_tag = "token-classification"
    metrics = ENTITY_METRICS
    main_metrics = metrics
    label_dtype = "int64"
    # the teacher's outputs are a distribution a token: not cached per row, so no new rows for it to label
    takes_new_rows = False
    caches_teacher_outputs = False
    augments_by_default = False  # the default augmentation was measured on sentence tasks
    pooled_output = False
    needs_offsets = True  # word_ids(): a fast tokenizer
    softened_outputs = True
    word_labels = True
    max_lengths = {"quick": 128, "full": 128}

    def num_labels(self, task) -> int:
        return len(task.labels) if task.labels else 0

    def head_config(self, task) -> dict:
        names = list(task.class_names)
        return {"num_labels": len(names), "id2label": dict(enumerate(names)),
                "label2id": {name: i for i, name in enumerate(names)}}

    def head_words(self, task) -> str:
        return f"tags {', '.join(task.class_names)}"

    def budget_data(self, budget, single_sentence):
        # a sentence of words: the quick budget's shorter single sentences (64 tokens) would cut CoNLL's long ones
        return super().budget_data(budget, single_sentence=False)

    def raw_features(self, task):
        import datasets  # here: see distillery.kinds.base

        return datasets.Features({"tokens": datasets.List(datasets.Value("string")),
                                  "tags": datasets.List(datasets.Value("int64"))})

    def check_encoding(self, tokenizer, pair_mode):
        if not getattr(tokenizer, "is_fast", False):
            raise DistilleryError(f"Token classification needs a fast tokenizer (its words' sub-words, word_ids()); "
                                  f"{type(tokenizer).__name__} is not one.")

    def encode(self, task, raw, tokenizer, data_config, pair_mode, split_name, train):
        from distillery.data.encode import encode_tokens  # here: see distillery.kinds.base

        every = bool(getattr(data_config, "label_all_subwords", False)) and train
        return encode_tokens(task, raw, tokenizer, data_config.max_length, split_name, label_all_subwords=every)

    def task_loss(self, outputs, batch, reduction="mean"):
        """``CE(logits, labels)`` over the positions whose label is not -100 (mean over them; ``reduction="none"``:
        each row's mean over its own, 0 for a row with none)."""
        if "labels" not in batch:
            raise ValueError("a token-classification batch needs labels.")
        logits, labels = logits_of(outputs), batch["labels"].to(logits_of(outputs).device).long()
        flat = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORED,
                               reduction="none" if reduction == "none" else "mean")
        if reduction != "none":
            return flat
        counted = (labels != IGNORED).sum(dim=1).clamp_min(1)
        return flat.reshape(labels.shape).sum(dim=1) / counted

    def distilled_positions(self, student_out, teacher_out, batch):
        """The (words, labels) logits of each word's first sub-word: the positions of :func:`word_positions`."""
        student, teacher = logits_of(student_out), logits_of(teacher_out)
        mask = word_positions(batch).to(student.device)
        if mask.shape != student.shape[:2] or teacher.shape != student.shape:
            raise ValueError(f"student logits {tuple(student.shape)}, teacher logits {tuple(teacher.shape)} and word "
                             f"positions {tuple(mask.shape)} do not line up.")
        return student[mask], teacher.to(student.device)[mask]

    def distillation_term(self, student_out, teacher_out, temperature, distribution_loss):
        """``distribution_loss(s, t, T)`` over the words' label distributions: ``s``, ``t`` of
        :meth:`distilled_positions` (the loss functions take the batch for it). 0 for a batch of no words."""
        student, teacher = logits_of(student_out), logits_of(teacher_out)
        if student.ndim != 2:
            raise ValueError("token classification distils each word's first sub-word: pass the batch "
                             "(prediction_distillation(..., batch=batch)) so that its positions are known.")
        if not len(student):
            return student.sum() * 0.0
        return distribution_loss(student, teacher, temperature)

    def distillation_gap(self, student_out, teacher_out, temperature, kl):
        if not len(logits_of(student_out)):
            return {"kl": 0.0}
        return super().distillation_gap(student_out, teacher_out, temperature, kl)

    def predictions(self, chunks, restore, task):
        """Logits (sentences, longest sentence's tokens, labels), each batch's padded with 0 past its length."""
        longest = max(c[0].shape[1] for c in chunks)
        outputs = chunks[0][0].shape[-1]
        if outputs != task.num_labels:
            raise DistilleryError(f"The model has {outputs} outputs a token but task {task.name} ({task.kind}) has "
                                  f"{task.num_labels} tags: its head does not match the task.")
        padded = np.concatenate([np.pad(c[0], ((0, 0), (0, longest - c[0].shape[1]), (0, 0))) for c in chunks])
        return restore(padded)

    def _word_tags(self, task_data, predicted: np.ndarray) -> tuple[list[list[str]], list[list[str]]]:
        """(gold, predicted) tag names of every dev word; ``predicted``: one tag id a token position (N, L). A word
        past the last token (cut by the length) is predicted ``O``."""
        import pyarrow.compute as pc

        names = np.asarray(task_data.task.class_names, dtype=object)
        dev = task_data.dev
        column = dev.select_columns(["word_mask"]).with_format("arrow")[:]["word_mask"]
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        flat = pc.list_flatten(column).to_numpy(zero_copy_only=False).astype(bool)
        # the (N, L) mask of first sub-words, from the ragged column in one scatter
        rows = np.repeat(np.arange(len(lengths)), lengths)
        cols = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        mask = np.zeros((len(lengths), max(predicted.shape[1], int(lengths.max(initial=0)))), dtype=bool)
        mask[rows[flat], cols[flat]] = True
        mask = mask[:, : predicted.shape[1]]
        kept = names[predicted[mask]]  # row by row, word by word
        gold_ids = task_data.dev_examples.with_format("arrow")[:]["tags"]
        words = pc.list_value_length(gold_ids).to_numpy(zero_copy_only=False)
        gold_flat = names[pc.list_flatten(gold_ids).to_numpy(zero_copy_only=False)]
        kept_counts = mask.sum(axis=1)
        gold, pred = [], []
        starts, kept_starts = np.cumsum(words) - words, np.cumsum(kept_counts) - kept_counts
        for i in range(len(words)):  # seqeval takes one list a sentence
            gold.append(gold_flat[starts[i]: starts[i] + words[i]].tolist())
            pred.append(kept[kept_starts[i]: kept_starts[i] + kept_counts[i]].tolist()
                        + [OUTSIDE] * int(words[i] - kept_counts[i]))
        return gold, pred

    def scores(self, task_data, predictions):
        return entity_metrics(*self._word_tags(task_data, np.asarray(predictions).argmax(axis=-1)))

    def chance(self, task_data):
        return None, f"always {OUTSIDE} (no entity)"  # chance_scores knows what it predicts

    def chance_scores(self, task_data, predictions):
        gold_ids = task_data.dev_examples["tags"]
        gold = [[task_data.task.class_names[t] for t in s] for s in gold_ids]
        return entity_metrics(gold, [[OUTSIDE] * len(s) for s in gold])
