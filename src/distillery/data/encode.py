"""Tokenization for every task, dynamic padding, and SQuAD answer extraction.

Encoded datasets hold exactly the model inputs the tokenizer produces (``input_ids``,
``attention_mask``, ``token_type_ids`` where the tokenizer has them) plus the targets: ``labels``
(int64 class ids or float32 scores), or ``start_positions``/``end_positions`` for SQuAD training.
SQuAD evaluation features also keep ``example_id`` and ``offset_mapping`` (None outside the
context) so that ``postprocess_squad`` can turn logits back into answer text; the collate function
drops every column a model does not take, and :func:`model_inputs` picks from a batch what one
model's ``forward`` takes: the one place a batch is filtered for a model.
"""

from __future__ import annotations

import collections
import inspect
import itertools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import datasets
import numpy as np
import torch

from distillery.config import DataConfig
from distillery.data.loading import column_values, load_raw
from distillery.data.tasks import TaskSpec
from distillery.errors import DistilleryError

logger = logging.getLogger("distillery")

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "input_ids_b", "attention_mask_b")
# teacher_logits: the teacher's predictions cached on the train split (MethodContext.train_with_teacher_logits),
# read by the methods that distil predictions (distill, cmow, autotinybert): one vector a row, or a tagger's one
# vector a word (a list of them a row, padded with NaN past a row's words); teacher_pooled: the teacher's
# sentence vector, which a pretrained student with another tokenizer aligns its own with
TARGETS = ("labels", "start_positions", "end_positions", "teacher_logits", "teacher_pooled")
# a pretrained student's SQuAD targets: the teacher's start/end distributions carried onto its own windows
# (one probability per position, so padded with 0 like the inputs; :mod:`distillery.distill.span_carry`)
SPAN_TARGETS = ("teacher_start", "teacher_end")
# a token classifier's targets, one a position: padded like the inputs, labels with the ignored -100, the mask of
# words' first sub-words with 0 (:mod:`distillery.kinds.token_classification`)
POSITION_TARGETS = {"labels": -100, "word_mask": 0}
# one flag a row that the run's kind reads from the batch: an embedder's pooling (distillery.kinds.embedding)
ROW_FLAGS = ("pooling",)
PAIR_MODES = ("joint", "separate")
MAX_QUESTION_TOKENS = 64  # as in BERT's run_squad (max_query_length)
MAP_BATCH = 1000


@dataclass
class TaskData:
    """A task's encoded splits, its raw dev examples, and how to batch them."""

    task: TaskSpec
    tokenizer: Any
    train: datasets.Dataset | None
    dev: datasets.Dataset | None
    dev_examples: datasets.Dataset | None  # raw dev split; SQuAD post-processing reads contexts here
    collate: Callable[[list[dict]], dict[str, torch.Tensor]]
    data_config: DataConfig
    dev_split: str = "dev"  # which dev split ``dev`` holds (MNLI: dev_matched or dev_mismatched)
    pair_mode: str = "joint"

    def labels(self, split: str) -> np.ndarray:
        """The gold labels of the encoded ``split`` ("train" or "dev"), in dataset order."""
        return np.asarray(column_values({"train": self.train, "dev": self.dev}[split], "labels"))


class PadCollator:
    """Pads a list of features to the longest in the batch and stacks them into tensors.

    Model inputs are padded (ids with the tokenizer's pad id, masks and token types with 0);
    targets and row flags are stacked; every other column (``example_id``, ``offset_mapping``, ...) is dropped.
    A class rather than a closure so DataLoader workers can pickle it.
    """

    def __init__(self, pad_token_id: int, padding_side: str = "right"):
        self.pad_values = {"input_ids": pad_token_id, "input_ids_b": pad_token_id}
        self.padding_side = padding_side

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        batch: dict[str, torch.Tensor] = {}
        first = features[0]
        for key in MODEL_INPUTS:
            if key in first:
                batch[key] = self._padded([f[key] for f in features], self.pad_values.get(key, 0), torch.long)
        for key in SPAN_TARGETS:  # one probability per position: padded like the inputs, with 0
            if key in first:
                batch[key] = self._padded([f[key] for f in features], 0.0, torch.float32)
        for key, pad in POSITION_TARGETS.items():  # a token classifier's: one a position
            if isinstance(first.get(key), (list, tuple)):
                batch[key] = self._padded([f[key] for f in features], pad, torch.long)
        for key in ROW_FLAGS:
            if key in first:
                batch[key] = torch.tensor([f[key] for f in features], dtype=torch.long)
        for key in TARGETS:
            if key in first and key not in batch:
                values = [f[key] for f in features]
                if any(len(v) and isinstance(v[0], (list, tuple)) for v in values if isinstance(v, (list, tuple))):
                    batch[key] = self._padded_vectors(values)  # one vector a word
                    continue
                first_value = values[0][0] if isinstance(values[0], (list, tuple)) and values[0] else values[0]
                dtype = torch.float32 if isinstance(first_value, float) else torch.long
                batch[key] = torch.tensor(values, dtype=dtype)
        return batch

    @staticmethod
    def _padded_vectors(rows: list) -> torch.Tensor:
        """Rows of vectors (a tagger's cached teacher logits, one a word) as (batch, most vectors, width) float32,
        NaN past a row's last vector: no value there, which no logit can be mistaken for."""
        width = next(len(r[0]) for r in rows if len(r))
        out = torch.full((len(rows), max(len(r) for r in rows), width), float("nan"))
        for i, r in enumerate(rows):
            if len(r):
                out[i, : len(r)] = torch.as_tensor(r, dtype=torch.float32)
        return out

    def _padded(self, rows: list, pad, dtype: torch.dtype) -> torch.Tensor:
        longest = max(len(r) for r in rows)
        out = torch.full((len(rows), longest), pad, dtype=dtype)
        for i, r in enumerate(rows):
            if not len(r):
                continue
            if self.padding_side == "left":
                out[i, longest - len(r) :] = torch.as_tensor(r, dtype=dtype)
            else:
                out[i, : len(r)] = torch.as_tensor(r, dtype=dtype)
        return out  # (batch, longest)


def taken_inputs(model) -> tuple[str, ...]:
    """The batch columns (``MODEL_INPUTS``) that ``model.forward`` takes: those it names, or all of
    them when it names none (a wrapper passing ``**kwargs`` on, as DDP's and torch.compile's do). A
    family without token types (DistilBERT, MPNet, ModernBERT) names no ``token_type_ids``."""
    try:
        named = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward without a readable signature: it gets what there is
        return MODEL_INPUTS
    return tuple(k for k in MODEL_INPUTS if k in named) or MODEL_INPUTS


def model_device(model) -> torch.device:
    """Where ``model`` computes: the device of its first parameter (or buffer); the CPU for a model of neither."""
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        return tensor.device
    return torch.device("cpu")


def model_inputs(batch: dict[str, torch.Tensor], model) -> dict[str, torch.Tensor]:
    """The keyword arguments of ``model`` for a collated batch: the model inputs it takes
    (:func:`taken_inputs`), never the targets, on the model's device."""
    device = model_device(model)
    return {k: batch[k].to(device) for k in taken_inputs(model) if k in batch}


def example_lengths(dataset) -> torch.Tensor | None:
    """Tokens per example (the ``input_ids`` column), read column-wise from Arrow; None if absent."""
    names = getattr(dataset, "column_names", None) or []
    if "input_ids" not in names:
        return None
    import pyarrow.compute as pc

    column = dataset.select_columns(["input_ids"]).with_format("arrow")[:]["input_ids"]
    return torch.from_numpy(pc.list_value_length(column).to_numpy(zero_copy_only=False).astype("int64"))


def content_digest(*splits) -> str:
    """sha256 of the rows of datasets (each column's Arrow data in row order, None for a missing
    split): two encodings hash alike exactly when they hold the same examples, whatever files,
    folders or settings they came from. Keys the caches of fine-tuned teachers and teacher logits."""
    import hashlib

    import pyarrow as pa

    digest = hashlib.sha256()
    for split in splits:
        if split is None:
            digest.update(b"<none>")
            continue
        table = split.with_format("arrow")[:]  # the selected rows (a train_limit subsample) in order
        # one chunk per column, so the bytes do not depend on how the table happened to be chunked
        batch = pa.RecordBatch.from_arrays([c.combine_chunks() for c in table.columns], names=table.column_names)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        digest.update(sink.getvalue().to_pybytes())
    return digest.hexdigest()


def length_batches(lengths, max_batch: int, slack: int = 16) -> list[list[int]]:
    """Indices of examples in batches for a pass in which examples do not interact (evaluation, the
    MoEBERT importance and refit passes), shortest first, with little padding.

    Examples are taken in order of length; the next one joins the current batch unless the batch
    holds ``max_batch`` examples already or raising the batch to its length would add more than
    ``slack`` padding tokens (the length step times the examples already in it). A batch costs a
    roughly fixed overhead besides its tokens, ~16 tokens' worth on a CPU, so exact-length batches
    (slack 0) lose as much to the overhead as fixed-size ones lose to padding (on 512 SST-2 examples,
    batches of 32 pad 15 % of the tokens; this rule with slack 16, 3 %).
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}.")
    lengths = np.asarray(lengths)
    batches: list[list[int]] = []
    batch: list[int] = []
    top = 0
    for i in np.argsort(lengths, kind="stable").tolist():  # once per pass: n steps of a few operations
        step = int(lengths[i]) - top
        if batch and (len(batch) >= max_batch or step * len(batch) > slack):
            batches.append(batch)
            batch = []
        batch.append(i)
        top = int(lengths[i])
    if batch:
        batches.append(batch)
    return batches


def make_collate(tokenizer) -> PadCollator:
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return PadCollator(pad_id, getattr(tokenizer, "padding_side", "right") or "right")


def prepare_task_data(
    task: TaskSpec,
    tokenizer,
    data_config: DataConfig,
    splits: Sequence[str] = ("train", "dev"),
    pair_mode: str = "joint",
) -> TaskData:
    """Load the raw splits with ``load_raw`` and encode them for ``tokenizer``.

    ``splits`` holds "train" and/or one dev split ("dev", or a name in ``task.dev_splits``).
    ``pair_mode="separate"`` tokenizes each side of a pair on its own (for the DiffCat student);
    single-sentence tasks are encoded the same way in both modes.
    """
    if pair_mode not in PAIR_MODES:
        raise DistilleryError(f"pair_mode must be one of {', '.join(PAIR_MODES)}, got {pair_mode!r}.")
    dev_names = [s for s in splits if s != "train"]
    if len(dev_names) > 1:
        raise DistilleryError(f"prepare_task_data takes one dev split at a time, got {', '.join(dev_names)}.")
    kind = task.kind_object
    kind.check_encoding(tokenizer, pair_mode)
    train = dev = dev_examples = None
    if "train" in splits:
        train = kind.encode(task, load_raw(task, "train", data_config), tokenizer, data_config, pair_mode, "train",
                            train=True)
    dev_split = dev_names[0] if dev_names else "dev"
    if dev_names:
        dev_examples = load_raw(task, dev_split, data_config)
        dev = kind.encode(task, dev_examples, tokenizer, data_config, pair_mode, dev_split, train=False)
    return TaskData(
        task=task,
        tokenizer=tokenizer,
        train=train,
        dev=dev,
        dev_examples=dev_examples,
        collate=make_collate(tokenizer),
        data_config=data_config,
        dev_split=dev_split,
        pair_mode=pair_mode,
    )


def encode_rows(task: TaskSpec, raw: datasets.Dataset, tokenizer, max_length: int, pair_mode: str = "joint",
                split_name: str = "train") -> datasets.Dataset:
    """Raw classification/regression rows (``text``, ``text_pair``, ``label``) encoded as a split of ``task``."""
    if task.is_pair and pair_mode == "separate":
        return encode_separate_pair(raw, tokenizer, max_length, split_name)
    if task.is_pair:
        return encode_pair(raw, tokenizer, max_length, split_name)
    return encode_single(raw, tokenizer, max_length, split_name)


# --- classification / regression -----------------------------------------------------------------


def _model_columns(tokenizer, encoding) -> list[str]:
    names = getattr(tokenizer, "model_input_names", None) or ["input_ids", "attention_mask", "token_type_ids"]
    return [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in encoding and k in names]


def _was_truncated(tokenizer, max_length, texts, pairs, encoded_ids) -> list[bool]:
    """Which examples lost tokens: only those that came out exactly max_length long can have."""
    flags = [False] * len(encoded_ids)
    full = [i for i, ids in enumerate(encoded_ids) if len(ids) >= max_length]
    if full:
        a = [texts[i] for i in full]
        b = [pairs[i] for i in full] if pairs is not None else None
        lengths = tokenizer(a, b, truncation=False, return_attention_mask=False, return_token_type_ids=False)
        for i, ids in zip(full, lengths["input_ids"]):
            flags[i] = len(ids) > max_length
    return flags


def _warn_truncated(dataset: datasets.Dataset, split_name: str, max_length: int) -> datasets.Dataset:
    n = int(sum(column_values(dataset, "_truncated")))
    if n:
        logger.warning("%d of %d %s examples were truncated to %d tokens", n, len(dataset), split_name, max_length)
    return dataset.remove_columns("_truncated")


def _with_labels(encoded: datasets.Dataset, raw: datasets.Dataset) -> datasets.Dataset:
    if raw.features["label"].dtype.startswith("float"):
        return encoded.cast_column("labels", datasets.Value("float32"))
    return encoded.cast_column("labels", datasets.Value("int64"))


def _encode_joint(raw: datasets.Dataset, tokenizer, max_length: int, split_name: str, pair: bool):
    def encode(batch):
        pairs = batch["text_pair"] if pair else None
        enc = tokenizer(batch["text"], pairs, truncation=True, max_length=max_length)
        out = {k: enc[k] for k in _model_columns(tokenizer, enc)}
        out["labels"] = batch["label"]
        out["_truncated"] = _was_truncated(tokenizer, max_length, batch["text"], pairs, enc["input_ids"])
        return out

    encoded = raw.map(encode, batched=True, batch_size=MAP_BATCH, remove_columns=raw.column_names)
    return _with_labels(_warn_truncated(encoded, split_name, max_length), raw)


def encode_single(raw: datasets.Dataset, tokenizer, max_length: int, split_name: str = "train") -> datasets.Dataset:
    """[CLS] text [SEP], truncated to ``max_length``; ``labels`` from ``label``."""
    return _encode_joint(raw, tokenizer, max_length, split_name, pair=False)


def encode_pair(raw: datasets.Dataset, tokenizer, max_length: int, split_name: str = "train") -> datasets.Dataset:
    """[CLS] text [SEP] text_pair [SEP] (the tokenizer's pair template), truncated longest-first."""
    return _encode_joint(raw, tokenizer, max_length, split_name, pair=True)


def encode_separate_pair(
    raw: datasets.Dataset, tokenizer, max_length: int, split_name: str = "train"
) -> datasets.Dataset:
    """Each side of the pair tokenized on its own: ``input_ids``/``attention_mask`` for ``text``,
    ``input_ids_b``/``attention_mask_b`` for ``text_pair`` (each ≤ max_length), for DiffCat."""

    def encode(batch):
        a = tokenizer(batch["text"], truncation=True, max_length=max_length, return_token_type_ids=False)
        b = tokenizer(batch["text_pair"], truncation=True, max_length=max_length, return_token_type_ids=False)
        trunc_a = _was_truncated(tokenizer, max_length, batch["text"], None, a["input_ids"])
        trunc_b = _was_truncated(tokenizer, max_length, batch["text_pair"], None, b["input_ids"])
        return {
            "input_ids": a["input_ids"],
            "attention_mask": a["attention_mask"],
            "input_ids_b": b["input_ids"],
            "attention_mask_b": b["attention_mask"],
            "labels": batch["label"],
            "_truncated": [x or y for x, y in zip(trunc_a, trunc_b)],
        }

    encoded = raw.map(encode, batched=True, batch_size=MAP_BATCH, remove_columns=raw.column_names)
    return _with_labels(_warn_truncated(encoded, split_name, max_length), raw)


# --- token classification ------------------------------------------------------------------------


def align_word_labels(word_ids: list[int | None], tags: list[int], continuation: np.ndarray | None = None):
    """(labels, word_mask) of one encoded sentence from its tokens' ``word_ids`` (None: a special token) and its
    words' tag ids: a word's first sub-word carries its tag and word_mask 1; its other sub-words -100 (or, given
    ``continuation``, the tag id that continues its tag: ``B-X`` -> ``I-X``), as special tokens do; and the number
    of words past the last token (cut by the length)."""
    wid = np.fromiter((-1 if w is None else w for w in word_ids), dtype=np.int64, count=len(word_ids))
    previous = np.concatenate([[-1], wid[:-1]])
    first = (wid >= 0) & (wid != previous)
    tag_ids = np.asarray(tags, dtype=np.int64)
    word_tags = tag_ids[np.maximum(wid, 0)] if len(tag_ids) else np.zeros_like(wid)
    labels = np.where(first, word_tags, -100)
    if continuation is not None:
        labels = np.where((wid >= 0) & ~first, continuation[word_tags], labels)
    cut = len(tag_ids) - int(first.sum())
    return labels.tolist(), first.astype(np.int64).tolist(), cut


def encode_tokens(task: TaskSpec, raw: datasets.Dataset, tokenizer, max_length: int, split_name: str = "train",
                  label_all_subwords: bool = False) -> datasets.Dataset:
    """Raw token-classification rows (``tokens``, ``tags``) encoded word by word (``is_split_into_words``), with
    ``labels`` on each word's first sub-word (:func:`align_word_labels`; every sub-word with
    ``label_all_subwords``) and ``word_mask`` marking those positions. A sentence longer than ``max_length`` tokens
    is cut, and how many words that leaves out is logged: scoring predicts them ``O``, never drops them."""
    continuation = None
    if label_all_subwords:
        names = list(task.class_names)
        continuation = np.asarray([names.index("I-" + n[2:]) if n.startswith("B-") and "I-" + n[2:] in names else i
                                   for i, n in enumerate(names)], dtype=np.int64)

    def encode(batch):
        enc = tokenizer(batch["tokens"], is_split_into_words=True, truncation=True, max_length=max_length)
        out = {k: enc[k] for k in _model_columns(tokenizer, enc)}
        out["labels"], out["word_mask"], out["_cut"] = [], [], []
        for i, tags in enumerate(batch["tags"]):  # one alignment a sentence, vectorized over its tokens
            labels, mask, cut = align_word_labels(enc.word_ids(i), tags, continuation)
            out["labels"].append(labels), out["word_mask"].append(mask), out["_cut"].append(cut)
        return out

    encoded = raw.map(encode, batched=True, batch_size=MAP_BATCH, remove_columns=raw.column_names)
    cut = np.asarray(column_values(encoded, "_cut"))
    if cut.any():
        words = int(sum(len(t) for t in column_values(raw, "tags")))
        fate = "are scored as predicted O" if split_name != "train" else "do not train"
        logger.warning("%d of %d %s words (in %d of %d sentences) lie past %d tokens and %s.", int(cut.sum()), words,
                       split_name, int((cut > 0).sum()), len(cut), max_length, fate)
    return encoded.remove_columns("_cut")


# --- SQuAD ---------------------------------------------------------------------------------------


def _squad_windows(batch, tokenizer, max_length: int, doc_stride: int):
    """Tokenize question + context into overlapping windows of the context.

    Questions longer than MAX_QUESTION_TOKENS (or half the window) are cut at a token boundary, and
    the stride is kept below half of the room left for the context, so that every window holds
    some context and the tokenizer never refuses an example.
    """
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    max_question = max(1, min(MAX_QUESTION_TOKENS, (max_length - specials) // 2))
    questions = [q.lstrip() for q in batch["question"]]
    q_enc = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True)
    longest = 0
    for i, offsets in enumerate(q_enc["offset_mapping"]):
        if len(offsets) > max_question:
            questions[i] = questions[i][: offsets[max_question - 1][1]]
        longest = max(longest, min(len(offsets), max_question))
    room = max_length - specials - longest
    stride = max(0, min(doc_stride, room // 2))
    return tokenizer(
        questions,
        batch["context"],
        truncation="only_second",
        max_length=max_length,
        stride=stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )


def _cls_index(tokenizer, input_ids) -> int:
    cls = tokenizer.cls_token_id
    return input_ids.index(cls) if cls is not None and cls in input_ids else 0


def encode_squad_train(raw: datasets.Dataset, tokenizer, max_length: int, doc_stride: int) -> datasets.Dataset:
    """Training windows with ``start_positions``/``end_positions`` of the first gold answer.

    A window that does not contain the whole answer, and every window of an unanswerable question,
    points both positions at the [CLS] token (index 0).
    """

    def encode(batch):
        enc = _squad_windows(batch, tokenizer, max_length, doc_stride)
        starts, ends = [], []
        for i, offsets in enumerate(enc["offset_mapping"]):
            cls = _cls_index(tokenizer, enc["input_ids"][i])
            seq = enc.sequence_ids(i)
            answers = batch["answers"][enc["overflow_to_sample_mapping"][i]]
            if not answers["answer_start"]:
                starts.append(cls), ends.append(cls)
                continue
            start_char = answers["answer_start"][0]
            end_char = start_char + len(answers["text"][0])
            ctx = [k for k, s in enumerate(seq) if s == 1]
            if not ctx or offsets[ctx[0]][0] > start_char or offsets[ctx[-1]][1] < end_char:
                starts.append(cls), ends.append(cls)
                continue
            first, last = ctx[0], ctx[-1]
            token_start = first
            while token_start <= last and offsets[token_start][0] <= start_char:
                token_start += 1
            token_end = last
            while token_end >= first and offsets[token_end][1] >= end_char:
                token_end -= 1
            starts.append(token_start - 1)
            ends.append(token_end + 1)
        out = {k: enc[k] for k in _model_columns(tokenizer, enc)}
        out["start_positions"] = starts
        out["end_positions"] = ends
        return out

    return raw.map(encode, batched=True, batch_size=MAP_BATCH, remove_columns=raw.column_names)


def squad_window_offsets(raw: datasets.Dataset, tokenizer, max_length: int, doc_stride: int) -> dict[str, np.ndarray]:
    """Where each training window of :func:`encode_squad_train` (same windows, same order) sits in its example:
    ``sample`` (the example's row in ``raw``), ``offsets`` (windows, longest, 2) of character spans in the
    context (-1 outside it: question, special tokens, padding), ``lengths`` (positions of each window),
    ``cls`` (the [CLS] position) and
    ``context_lengths`` per example: what carries a distribution from one tokenizer's windows to another's
    (:mod:`distillery.distill.span_carry`)."""
    samples, spans, cls = [], [], []
    for start in range(0, len(raw), MAP_BATCH):
        batch = raw[start:start + MAP_BATCH]
        enc = _squad_windows(batch, tokenizer, max_length, doc_stride)
        for i, offsets in enumerate(enc["offset_mapping"]):
            samples.append(start + enc["overflow_to_sample_mapping"][i])
            in_context = np.asarray([s == 1 for s in enc.sequence_ids(i)], dtype=bool)
            spans.append(np.where(in_context[:, None], np.asarray(offsets, dtype=np.int64).reshape(-1, 2), -1))
            cls.append(_cls_index(tokenizer, enc["input_ids"][i]))
    longest = max((len(w) for w in spans), default=0)
    offsets = np.full((len(spans), longest, 2), -1, dtype=np.int64)
    for w, window in enumerate(spans):  # one copy per window into the padded array
        offsets[w, : len(window)] = window
    return {"sample": np.asarray(samples, dtype=np.int64), "offsets": offsets, "cls": np.asarray(cls, dtype=np.int64),
            "lengths": np.asarray([len(w) for w in spans], dtype=np.int64),
            "context_lengths": np.asarray([len(c) for c in raw["context"]], dtype=np.int64)}


def encode_squad_eval(raw: datasets.Dataset, tokenizer, max_length: int, doc_stride: int) -> datasets.Dataset:
    """Evaluation windows keeping ``example_id`` and ``offset_mapping`` (None outside the context)."""

    def encode(batch):
        enc = _squad_windows(batch, tokenizer, max_length, doc_stride)
        out = {k: enc[k] for k in _model_columns(tokenizer, enc)}
        out["example_id"] = [batch["id"][s] for s in enc["overflow_to_sample_mapping"]]
        out["offset_mapping"] = [
            [list(o) if s == 1 else None for o, s in zip(offsets, enc.sequence_ids(i))]
            for i, offsets in enumerate(enc["offset_mapping"])
        ]
        return out

    features = datasets.Features(
        {
            "input_ids": datasets.List(datasets.Value("int64")),
            "attention_mask": datasets.List(datasets.Value("int64")),
            **({"token_type_ids": datasets.List(datasets.Value("int64"))} if _has_token_types(tokenizer) else {}),
            "example_id": datasets.Value("string"),
            "offset_mapping": datasets.List(datasets.List(datasets.Value("int64"))),
        }
    )
    return raw.map(encode, batched=True, batch_size=MAP_BATCH, remove_columns=raw.column_names, features=features)


def _has_token_types(tokenizer) -> bool:
    return "token_type_ids" in _model_columns(tokenizer, tokenizer("a", "b"))


def postprocess_squad(
    examples,
    features,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    n_best: int = 20,
    max_answer_length: int = 30,
    version_2: bool = False,
    null_score_threshold: float = 0.0,
) -> dict[str, str]:
    """Answer text per example id from window logits (start/end: (n_features, seq_len)).

    For each window, the ``n_best`` highest start and end positions are crossed (numpy, no Python
    double loop); a span counts when both ends lie in the context, end >= start, and it is at most
    ``max_answer_length`` tokens. The best span over an example's windows wins. SQuAD v2 answers ""
    when the null score (start[CLS] + end[CLS], the lowest over windows) beats the best span score
    by more than ``null_score_threshold``.
    """
    start_logits = np.asarray(start_logits, dtype=np.float32)
    end_logits = np.asarray(end_logits, dtype=np.float32)
    if len(start_logits) != len(features) or len(end_logits) != len(features):
        raise ValueError(f"{len(features)} features but {len(start_logits)}/{len(end_logits)} rows of logits")
    by_example: dict[str, list[int]] = collections.defaultdict(list)
    for i, example_id in enumerate(column_values(features, "example_id")):
        by_example[example_id].append(i)
    all_offsets = column_values(features, "offset_mapping")
    if isinstance(examples, datasets.Dataset):
        ids, contexts = column_values(examples, "id"), column_values(examples, "context")
    else:
        ids, contexts = [e["id"] for e in examples], [e["context"] for e in examples]

    predictions: dict[str, str] = {}
    for example_id, context in zip(ids, contexts):
        best_score, best_text = -np.inf, ""
        null_score = np.inf
        for i in by_example.get(example_id, []):
            offsets = all_offsets[i]
            length = len(offsets)
            start, end = start_logits[i, :length], end_logits[i, :length]
            null_score = min(null_score, float(start[0] + end[0]))
            in_context = np.array([o is not None for o in offsets])
            k = min(n_best, length)
            s_idx = np.argsort(start)[::-1][:k]  # (k,)
            e_idx = np.argsort(end)[::-1][:k]  # (k,)
            scores = start[s_idx][:, None] + end[e_idx][None, :]  # (k, k)
            span = e_idx[None, :] - s_idx[:, None] + 1  # (k, k)
            valid = in_context[s_idx][:, None] & in_context[e_idx][None, :] & (span >= 1) & (span <= max_answer_length)
            if not valid.any():
                continue
            scores = np.where(valid, scores, -np.inf)
            a, b = np.unravel_index(int(np.argmax(scores)), scores.shape)
            if scores[a, b] > best_score:
                best_score = float(scores[a, b])
                best_text = context[offsets[s_idx[a]][0] : offsets[e_idx[b]][1]]
        if version_2 and (best_score == -np.inf or null_score - best_score > null_score_threshold):
            best_text = ""
        predictions[example_id] = best_text
    return predictions
