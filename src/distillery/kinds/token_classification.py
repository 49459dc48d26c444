"""Token classification (named-entity recognition, part-of-speech tagging): one tag a word, predicted as one
``logits`` vector a sub-word token and scored on words by seqeval's entity precision, recall and F1.

Labels sit on words, not sub-words, as transformers' own token-classification example puts them: the first
sub-word of each word carries the word's tag; the word's other sub-words, the special tokens and padding carry
-100 and are left out of the loss, the distillation term and the metrics. ``data.label_all_subwords`` labels the
other sub-words of a training sentence too (``B-X`` continues as ``I-X``); a dev sentence is always scored on its
first sub-words. The encoded rows say which positions are first sub-words (``word_mask``), so a row without gold
tags still has its words. A sentence longer than the model's length is never silently cut: its words past the
last token are scored as predicted ``O`` (the encoding logs how many there are).

The teacher's outputs are cached a row each as its logits on the row's words (``teacher_logits``: a list of one
vector a word, each read on the word's first sub-word; :meth:`TokenClassification.cached_rows`), so the student's
distillation term reads them instead of running the teacher, as a sentence task's does. Word by word, they carry to
a student with another tokenizer (``distill --student``): its first sub-word of word i learns the teacher's
distribution of word i, and a word either side's length cut is left out of the term. New rows (``--augment``,
``--unlabeled-file``) are sentences of words, each tagged by the teacher (the argmax of its logits on the word).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from distillery.errors import DistilleryError
from distillery.kinds.base import TaskKind, arrow_column, logits_of
from distillery.kinds.classification import Classification
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


class WordLogits(SimpleNamespace):
    """A batch's cached teacher logits (``logits``: (rows, words, labels)), one vector a word of each row in order,
    NaN past a row's last: the words the student's rows and the teacher's share (:meth:`TokenClassification.
    distilled_positions` pairs word i of each with the row's i-th first sub-word)."""


def padded(column) -> tuple[np.ndarray, np.ndarray]:
    """A ragged Arrow column of numbers (a list a row) as a (rows, longest) array, 0 past each row's end (one
    scatter), and each row's length."""
    import pyarrow.compute as pc

    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(column).to_numpy(zero_copy_only=False)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    cols = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out = np.zeros((len(lengths), int(lengths.max(initial=0))), dtype=flat.dtype)
    out[rows, cols] = flat
    return out, lengths


def word_vectors(column) -> tuple[np.ndarray, np.ndarray]:
    """A column of one vector a word (``teacher_logits``) as the (words, labels) float32 vectors of every row's words
    in order, and each row's number of words."""
    import pyarrow.compute as pc

    counts = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
    words = pc.list_flatten(column)
    values = pc.list_flatten(words).to_numpy(zero_copy_only=False).astype(np.float32)
    return values.reshape(len(words), -1) if len(words) else values.reshape(0, 0), counts


def ragged(values: np.ndarray, lengths: np.ndarray):
    """Rows of ``lengths`` items cut from ``values`` (in order) as an Arrow list column: of numbers (1-d ``values``)
    or of fixed-size vectors (2-d: one vector an item)."""
    import pyarrow as pa

    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    items = pa.array(values.reshape(-1)) if values.ndim == 1 else \
        pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1).astype(np.float32)), values.shape[1])
    return pa.ListArray.from_arrays(offsets, items)


def words_of(dataset) -> np.ndarray:
    """The (rows, longest) bool mask of each encoded row's words' first sub-words (its ``word_mask``)."""
    return padded(arrow_column(dataset, "word_mask"))[0].astype(bool)


def first_words(mask: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``mask`` (first sub-words, (rows, positions)) kept on each row's first ``counts`` words only; a row with fewer
    words than its count is an error (its cached words would not be its own)."""
    if (mask.sum(axis=-1) < counts).any():
        raise ValueError("a row has fewer words than teacher vectors cached for it.")
    return mask & (np.cumsum(mask, axis=-1) <= counts[:, None])


class TokenClassification(TaskKind):
    name = "token_classification"
    head = TOKEN_HEAD
    pipeline_tag = "token-classification"
    metrics = ENTITY_METRICS
    main_metrics = metrics
    label_dtype = "int64"
    # the teacher's outputs cached a row each, one vector a word (the module docstring), which label new rows
    takes_new_rows = True
    caches_teacher_outputs = True
    augments_by_default = False  # the default augmentation was measured on sentence tasks
    pooled_output = False
    needs_offsets = True  # word_ids(): a fast tokenizer
    softened_outputs = True
    word_labels = True
    max_lengths = {"quick": 128, "full": 128}
    # the static-embedding baseline tags each word (live_baselines.StaticTaggerModel) by a classifier over its
    # token vectors: the same logistic regression as a sentence's class, a word a row
    static_head = "logistic-regression"
    fit_static_head = Classification.fit_static_head
    static_head_weights = Classification.static_head_weights

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
        """The (words, labels) logits of each word's first sub-word: the positions of :func:`word_positions`. Cached
        teacher logits (:class:`WordLogits`, one vector a word) pair with the row's first sub-words in order, as many
        as the row has vectors (fewer where the teacher's encoding cut words the student's kept)."""
        student, teacher = logits_of(student_out), logits_of(teacher_out)
        mask = word_positions(batch).to(student.device)
        if isinstance(teacher_out, WordLogits):
            teacher = teacher.to(student.device).float().reshape(len(student), -1, student.shape[-1])
            cached = ~torch.isnan(teacher[..., 0])  # (rows, words): a prefix of each row
            counts = cached.sum(dim=1)
            if (mask.sum(dim=1) < counts).any():
                raise ValueError("a row has fewer words than teacher vectors cached for it.")
            return student[mask & (mask.long().cumsum(dim=1) <= counts[:, None])], teacher[cached]
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

    def cached_teacher_outputs(self, logits):
        return WordLogits(logits=logits)

    def cached_rows(self, outputs, train):
        """The teacher's logits on each row's words' first sub-words, (rows, most words x labels), NaN past a row's
        words: the cache keeps words, not every sub-word and padding."""
        logits = np.asarray(outputs, dtype=np.float32)  # (rows, positions, labels)
        mask = words_of(train)[:, : logits.shape[1]]
        counts = mask.sum(axis=1)
        out = np.full((len(logits), int(counts.max(initial=0)), logits.shape[-1]), np.nan, dtype=np.float32)
        rows, cols = np.nonzero(mask)  # row by row, word by word
        out[rows, np.cumsum(mask, axis=1)[rows, cols] - 1] = logits[rows, cols]
        return out.reshape(len(logits), -1)

    def teacher_logits_column(self, cached, train):
        """A list of one vector a word a row (an Arrow column), from :meth:`cached_rows`."""
        counts = words_of(train).sum(axis=1)
        width = int(counts.max(initial=0))
        labels = cached.shape[1] // width if width else 0
        if width and cached.shape[1] != width * labels:
            raise ValueError(f"cached teacher logits of width {cached.shape[1]} are no {width} words' vectors.")
        vectors = cached.reshape(len(cached), width, labels)[np.arange(width)[None, :] < counts[:, None]]
        return ragged(vectors, counts)

    def cached_predictions(self, train):
        return word_vectors(arrow_column(train, "teacher_logits"))[0]

    def unlabelled(self, raw):
        """New rows' placeholder tags: ``O`` (tag 0) for every word, until the teacher tags them."""
        import pyarrow.compute as pc

        lengths = pc.list_value_length(arrow_column(raw, "tokens")).to_numpy(zero_copy_only=False).astype(np.int64)
        return raw.add_column("tags", ragged(np.zeros(int(lengths.sum()), dtype=np.int64), lengths))

    def new_row_labels(self, rows):
        """Each new row's ``labels``: the teacher's tag (the argmax of its logits on the word) on the first sub-word
        of each word it has logits for, -100 elsewhere (an Arrow column)."""
        vectors, counts = word_vectors(arrow_column(rows, "teacher_logits"))
        mask, lengths = padded(arrow_column(rows, "word_mask"))
        labels = np.full(mask.shape, IGNORED, dtype=np.int64)
        labels[first_words(mask.astype(bool), counts)] = vectors.argmax(axis=-1) if len(vectors) else []
        return ragged(labels[np.arange(mask.shape[1])[None, :] < lengths[:, None]], lengths)

    def carried_teacher_logits(self, labelled, other, originals):
        """Word i's teacher vector for ``other``'s first sub-word of word i: each row's vectors cut to the words both
        encodings kept (a longer sentence loses its last words to either side's length). None where the two do not
        line up: another number of rows, or other gold tags on a word both kept among the first ``originals``."""
        if len(labelled) != len(other):
            return None
        (t_tags, t_count), (s_tags, s_count) = (self._word_tags_of(d.select(range(originals)))
                                                for d in (labelled, other))
        width = min(t_tags.shape[1], s_tags.shape[1])
        both = np.arange(width)[None, :] < np.minimum(t_count, s_count)[:, None]
        if not (t_tags[:, :width][both] == s_tags[:, :width][both]).all():
            return None
        vectors, counts = word_vectors(arrow_column(labelled, "teacher_logits"))
        kept = np.minimum(counts, words_of(other).sum(axis=1))
        index = np.arange(len(vectors)) - np.repeat(np.cumsum(counts) - counts, counts)  # a vector's word in its row
        return ragged(vectors[index < np.repeat(kept, counts)], kept)

    @staticmethod
    def _word_tags_of(encoded) -> tuple[np.ndarray, np.ndarray]:
        """The gold tag of each row's words (on their first sub-words), (rows, most words) padded with -1, and the
        number of words of each row."""
        labels, _ = padded(arrow_column(encoded, "labels"))
        mask = words_of(encoded)
        counts = mask.sum(axis=1)
        tags = np.full((len(mask), int(counts.max(initial=0))), -1, dtype=np.int64)
        tags[np.arange(tags.shape[1])[None, :] < counts[:, None]] = labels[mask]
        return tags, counts

    def predictions(self, chunks, restore, task):
        """Logits (sentences, longest sentence's tokens, labels), each batch's padded with 0 past its length."""
        longest = max(c[0].shape[1] for c in chunks)
        outputs = chunks[0][0].shape[-1]
        if outputs != task.num_labels:
            raise DistilleryError(f"The model has {outputs} outputs a token but task {task.name} ({task.kind}) has "
                                  f"{task.num_labels} tags: its head does not match the task.")
        stacked = np.concatenate([np.pad(c[0], ((0, 0), (0, longest - c[0].shape[1]), (0, 0))) for c in chunks])
        return restore(stacked)

    def _word_tags(self, task_data, predicted: np.ndarray) -> tuple[list[list[str]], list[list[str]]]:
        """(gold, predicted) tag names of every dev word; ``predicted``: one tag id a token position (N, L). A word
        past the last token (cut by the length) is predicted ``O``."""
        import pyarrow.compute as pc

        names = np.asarray(task_data.task.class_names, dtype=object)
        mask = words_of(task_data.dev)  # (N, L): first sub-words, as wide as the predictions
        mask = np.pad(mask, ((0, 0), (0, max(0, predicted.shape[1] - mask.shape[1]))))[:, : predicted.shape[1]]
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
