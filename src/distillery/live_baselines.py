"""Live baselines: what a user gets for free, measured on their task and their machine.

A student is worth its training only where it beats what costs nothing to make. Two such models
are built from the run's own teacher and train split, then scored on the same dev set and timed in
the same bench process as teacher and student, so that no measured number needs to live in ``src/``:

- ``teacher-int8``: the teacher's dynamic-int8 copy (:func:`distillery.export.build_variants`).
- ``static-embeddings``: the model2vec idea (Tulkens & van Dongen, 2024) done through distillery's
  own code: every vocabulary token is run through the teacher's encoder as a one-token sentence
  (with its special tokens), the outputs are reduced by PCA (optionally weighted by SIF), a sentence
  is the mean of its tokens' vectors, and a logistic-regression (classification) or ridge
  (regression) head is fitted on the run's train split. A token task (NER) gets a tagger instead: each word
  is read at its first sub-word, from that token's vector beside its neighbours' (one token each side), by a
  logistic regression fitted on the train split's words. The model2vec library itself is not used: its
  ``distill`` extra pins ``transformers<5.4`` (distillery runs on 5.x) and needs ``skeletoken``,
  and it reads only ``AutoModel`` teachers, not distillery's own students.

An embedder (``--task embedding``) gets the static vectors themselves as ``static-embeddings``: model2vec's table
(PCA, SIF counted on the run's text), scored as its student is, with no head (method static's start, before its
fine-tuning). SQuAD gets the int8 teacher only: a bag of token vectors has no answer span to point at. This module only
builds the models; the report weighs them against the student (:mod:`distillery.report_parts`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from transformers.modeling_outputs import SequenceClassifierOutput, TokenClassifierOutput

from distillery.data.encode import example_lengths, length_batches
from distillery.errors import DistilleryError
from distillery.evaluation import score
from distillery.export import build_variants, kept_exports_folder
from distillery.export.formats import resolve_format
from distillery.kinds import TaskKind
from distillery.run_record import INT8_NAME, STATIC_NAME
from distillery.runtime import require_onnx
from distillery.static.options import EMBEDDER_SIF
from distillery.static.vectors import model2vec_embedder, reduced_token_vectors, sif_weights

logger = logging.getLogger("distillery")

LOGIT_ABSENT = -1e4  # the logit of a class the train split never shows: never the argmax
# A tagger's head is fitted on at most this many of the train split's words (drawn with a fixed seed): CoNLL-2003's
# 204k words of 3 × 256 features are 1.2 GB of float64 and minutes of fitting, for no better a baseline.
TAGGER_FIT_WORDS = 50_000


# --------------------------------------------------------------------------------------------
# The static-embedding model


@dataclass
class StaticEmbeddingConfig:
    """What :class:`StaticEmbeddingModel` is; ``vocab_size`` is what bench.make_inputs reads."""

    vocab_size: int
    dim: int
    num_outputs: int
    pair: bool = False
    sep_token_id: int | None = None
    normalize: bool = True
    head: str = "logistic-regression"
    pca_dims: int | None = None
    sif: float | None = None
    teacher_dim: int | None = None
    # a tagger (a token task): the head reads each token's vector and ``window`` neighbours' each side
    tagger: bool = False
    window: int = 0
    model_type: str = "static-embeddings"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StaticEmbeddingModel(nn.Module):
    """Token vectors averaged over a sentence (one EmbeddingBag call), then a linear head.

    Pair tasks: each side is averaged on its own and the head reads ``a ‖ b ‖ |a−b| ‖ a·b``.
    Special tokens ([CLS], [SEP], padding) count in no mean: their vectors would add a constant
    that only depends on a sentence's length.
    """

    def __init__(self, vectors: torch.Tensor, counted: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                 config: StaticEmbeddingConfig):
        super().__init__()
        self.config = config
        self.embeddings = nn.EmbeddingBag.from_pretrained(vectors.float(), freeze=True, mode="sum")  # (V, d)
        self.register_buffer("counted", counted.float())  # (V,) 1 for tokens that enter the mean
        self.head = nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            self.head.weight.copy_(weight)
            self.head.bias.copy_(bias)
        self.head.requires_grad_(False)

    def _mean(self, input_ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        weights = keep.to(self.embeddings.weight.dtype)  # (B, T); a bag's weights must match its table (fp16 on a GPU)
        weights = weights / weights.sum(1, keepdim=True).clamp_min(1.0)
        v = self.embeddings(input_ids, per_sample_weights=weights)  # (B, T) -> (B, d): each row a bag
        return F.normalize(v, dim=-1) if self.config.normalize else v

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The head's input, (B, d) or (B, 4d) for a pair."""
        real = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
        keep = real & self.counted[input_ids].bool()
        if not self.config.pair:
            return self._mean(input_ids, keep)
        from distillery.cmow.modeling_cmow import segment_masks  # the one place a joint pair is split

        # Segments are read from the real tokens: the separators decide where B starts, then leave the means.
        first, second = segment_masks(input_ids, real.long(), token_type_ids, self.config.sep_token_id)
        a, b = self._mean(input_ids, keep & first), self._mean(input_ids, keep & second)
        return torch.cat([a, b, (a - b).abs(), a * b], dim=-1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> SequenceClassifierOutput:
        return SequenceClassifierOutput(logits=self.head(self.features(input_ids, attention_mask, token_type_ids)))


class StaticTaggerModel(nn.Module):
    """Each token's vector beside its neighbours' (``window`` tokens each side, in order), then a linear head at
    every position: the static-embedding baseline of a token task, whose words are read at their first sub-word
    as every tagger's. Special tokens and padding are zero vectors (they stand for no word), so the first word's
    left neighbour is nothing, not [CLS]."""

    def __init__(self, vectors: torch.Tensor, counted: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                 config: StaticEmbeddingConfig):
        super().__init__()
        self.config = config
        self.embeddings = nn.Embedding.from_pretrained(vectors.float(), freeze=True)  # (V, d)
        self.register_buffer("counted", counted.float())  # (V,) 0 for the special tokens
        self.head = nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            self.head.weight.copy_(weight)
            self.head.bias.copy_(bias)
        self.head.requires_grad_(False)

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The head's input at every position, (B, T, (2·window + 1)·d)."""
        real = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
        v = self.embeddings(input_ids)  # (B, T, d)
        if self.config.normalize:
            v = F.normalize(v, dim=-1)
        v = v * (real & self.counted[input_ids].bool()).unsqueeze(-1).to(v.dtype)
        w, length = self.config.window, input_ids.shape[1]
        padded = F.pad(v, (0, 0, w, w))  # (B, T + 2w, d): nothing before the first token and after the last
        return torch.cat([padded[:, k: k + length] for k in range(2 * w + 1)], dim=-1)  # x_{t−w} ‖ … ‖ x_{t+w}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> TokenClassifierOutput:
        return TokenClassifierOutput(logits=self.head(self.features(input_ids, attention_mask, token_type_ids)))


# --------------------------------------------------------------------------------------------
# The head, fitted on the train split


def _train_features(model: StaticEmbeddingModel | StaticTaggerModel, task_data,
                    batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, F) head inputs and (N,) labels of the train split, in batches of similar lengths: a row each, or for a
    tagger a labelled position each (each word's first sub-word; with ``--label-all-subwords`` its others too, as
    the task loss reads them), at most :data:`TAGGER_FIT_WORDS` of them drawn with a fixed seed."""
    dataset = task_data.train
    batches = length_batches(example_lengths(dataset).numpy(), batch_size)
    loader = DataLoader(dataset, batch_sampler=batches, collate_fn=task_data.collate)
    features, labels = [], []
    with torch.inference_mode():
        for batch in loader:
            f = model.features(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids"))
            y = batch["labels"]
            if model.config.tagger:  # (B, T, F) -> the labelled positions' (n, F)
                labelled = y != -100
                f, y = f[labelled], y[labelled]
            features.append(f)
            labels.append(y)
    features, labels = torch.cat(features), torch.cat(labels)
    if model.config.tagger and len(labels) > TAGGER_FIT_WORDS:
        kept = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))[:TAGGER_FIT_WORDS].sort().values
        features, labels = features[kept], labels[kept]
    return features.double().numpy(), labels.numpy()


def linear_head(pipeline, kind: TaskKind, num_labels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fitted pipeline (``kind.fit_static_head``) as one (K, F) weight and (K,) bias: the scaler folded into the
    linear map, then laid out as the kind's head (a class the train split lacks gets the logit -1e4)."""
    scaler, estimator = pipeline[0], pipeline[-1]
    coef = np.atleast_2d(estimator.coef_) / scaler.scale_  # (k, F)
    bias = np.atleast_1d(estimator.intercept_) - coef @ scaler.mean_  # (k,)
    weight, bias = kind.static_head_weights(coef, bias, estimator, num_labels, LOGIT_ABSENT)
    return torch.from_numpy(weight).float(), torch.from_numpy(bias).float()


def _check_static_inputs(tokenizer, task_data, pca_dims, sif) -> None:
    task = task_data.task
    if task.kind_object.static_head is None:
        raise DistilleryError(f"The static-embedding baseline takes classification, regression and token tasks, not "
                              f"task {task.name} ({task.kind_object.pipeline_tag}): a bag of token vectors has no "
                              f"answer span to point at.")
    if task_data.train is None or len(task_data.train) == 0:
        raise DistilleryError(f"The static-embedding baseline is fitted on the train split of {task.name}, "
                              "and none was prepared.")
    if getattr(task_data, "pair_mode", "joint") != "joint":
        raise DistilleryError("The static-embedding baseline reads joint pair encodings; prepare the task data "
                              "with pair_mode='joint'.")
    if pca_dims is not None and (isinstance(pca_dims, bool) or not isinstance(pca_dims, int) or pca_dims < 1):
        raise DistilleryError(f"pca_dims must be a positive whole number or None, got {pca_dims!r}.")
    if sif is not None and not 0 < sif < 1:
        raise DistilleryError(f"sif must be a number between 0 and 1 (exclusive) or None, got {sif!r}.")
    if task.is_pair and tokenizer.sep_token_id is None and "token_type_ids" not in tokenizer.model_input_names:
        raise DistilleryError("The tokenizer has neither a separator token nor token types, so the static-embedding "
                              "baseline cannot tell the two sentences of a pair apart.")


def static_embedding_baseline(teacher: nn.Module, tokenizer, task_data, *, pca_dims: int | None = 256,
                              sif: float | None = None, normalize: bool = True, batch_size: int = 1024,
                              window: int = 1) -> StaticEmbeddingModel | StaticTaggerModel:
    """A static-embedding model distilled from ``teacher`` with a head fitted on ``task_data.train``: a sentence's
    mean vector (:class:`StaticEmbeddingModel`), or for a task whose labels sit on words a tagger
    (:class:`StaticTaggerModel`, reading ``window`` neighbouring tokens each side: on 2,000 CoNLL-2003 sentences
    with a teacher of 0.46 entity F1, windows 0, 1 and 2 scored 0.496, 0.575 and 0.600 on 1,000 dev sentences,
    the fit taking 62, 90 and 86 s on 2 cores; 1 takes most of the gain for a third of the features of 2).

    ``pca_dims``: the token vectors' width after PCA (None: the teacher's). ``sif``: the SIF weight's
    ``a`` (None, the default: a plain mean; on SST-2 with the built-in teacher, a = 1e-3 gained nothing; a tagger
    has no mean to weigh). The fitted scikit-learn pipeline stays on the model as ``sklearn_head``."""
    _check_static_inputs(tokenizer, task_data, pca_dims, sif)
    task = task_data.task
    started = time.time()
    vectors, basis, counted = reduced_token_vectors(teacher, tokenizer, pca_dims, 0, batch_size=batch_size)  # (V, d)
    teacher_dim = vectors.shape[1] if basis is None else basis.shape[1]
    if sif is not None and not task.kind_object.word_labels:
        vectors = vectors * sif_weights(task_data.train, counted, sif)[:, None]
    kind, outputs = task.kind_object, task.num_labels
    dim = vectors.shape[1]
    tagger = kind.word_labels  # one label a word: a tag a position, not a sentence's mean
    config = StaticEmbeddingConfig(
        vocab_size=len(vectors), dim=dim, num_outputs=outputs, pair=task.is_pair, sep_token_id=tokenizer.sep_token_id,
        normalize=normalize, head=kind.static_head,
        pca_dims=dim if dim < teacher_dim else None, sif=None if tagger else sif, teacher_dim=teacher_dim,
        tagger=tagger, window=int(window) if tagger else 0)
    width = (2 * config.window + 1) * dim if tagger else 4 * dim if task.is_pair else dim
    model = (StaticTaggerModel if tagger else StaticEmbeddingModel)(vectors, counted, torch.zeros(outputs, width),
                                                                     torch.zeros(outputs), config)
    features, labels = _train_features(model, task_data, batch_size)
    pipeline = kind.fit_static_head(features, labels, seed=0)
    weight, bias = linear_head(pipeline, kind, task.num_labels or 1)
    with torch.no_grad():
        model.head.weight.copy_(weight)
        model.head.bias.copy_(bias)
    model.sklearn_head = pipeline
    logger.info("Static-embedding baseline: %d tokens x %d dims, %s head on %d %s, %.1f s.",
                len(vectors), dim, config.head, len(labels), "words" if tagger else "examples", time.time() - started)
    return model.eval()


# --------------------------------------------------------------------------------------------
# Both baselines, ready to be scored and benchmarked


class LiveBaselines(dict):
    """``{name: (model, dev metrics)}``, plus ``notes`` (plain sentences: a baseline this task or machine
    could not have, and why) and ``info`` (how each was made)."""

    def __init__(self):
        super().__init__()
        self.notes: list[str] = []
        self.info: dict[str, dict[str, Any]] = {}


def int8_backend(fmt: str, teacher: nn.Module) -> tuple[str, str | None]:
    """The int8 backend to use: ``fmt`` resolved for the teacher, or torch's own int8 where the ONNX one
    is asked for and onnxruntime is not installed (the baseline is free: it needs no optional extra)."""
    resolved = resolve_format(fmt, getattr(teacher, "config", None))
    if resolved == "torch-int8":
        return resolved, None
    try:
        require_onnx()
    except DistilleryError:
        return "torch-int8", ("The int8 teacher uses torch's dynamic int8 (onnxruntime, often faster, is not installed: "
                              "pip install 'distillery[onnx]').")
    return resolved, None


def _int8_baseline(teacher, tokenizer, task_data, teacher_metrics, int8_format: str, out: LiveBaselines,
                   teacher_folder: str | None = None) -> None:
    fmt, note = int8_backend(int8_format, teacher)
    if note:
        out.notes.append(note)
    source = {"teacher": dict(teacher_metrics)} if teacher_metrics else None
    try:
        variants, metrics, manifests = build_variants({"teacher": (teacher, tokenizer)}, [fmt], task_data=task_data,
                                                      source_metrics=source,
                                                      kept={"teacher": kept_exports_folder(teacher_folder, task_data)})
    except DistilleryError as e:  # a teacher that does not export (a BiLSTM head) still gets its static baseline
        out.notes.append(f"No int8 teacher: {e}")
        return
    key = next(iter(variants))
    model = variants[key]
    out[INT8_NAME] = (model, metrics.get(key) or score(model, task_data))
    out.info[INT8_NAME] = {"format": fmt, "backend": manifests[key].get("backend")}


def live_baselines(teacher: nn.Module, tokenizer, task_data, *, teacher_metrics: Mapping[str, float] | None = None,
                   teacher_int8: tuple[nn.Module, Mapping[str, float]] | None = None, int8_format: str = "int8",
                   static: bool = True, pca_dims: int | None = 256, sif: float | None = None,
                   batch_size: int = 1024, teacher_folder: str | None = None, texts=None) -> LiveBaselines:
    """The free baselines of a run, built from its fine-tuned ``teacher`` and scored on ``task_data``'s dev
    split: ``teacher-int8`` (``int8_format``: "int8" picks the faster backend) and, for classification and
    regression, ``static-embeddings``. ``teacher_metrics`` (the teacher's dev metrics) saves scoring it
    again; ``teacher_int8`` (model, dev metrics), an int8 export the run already made, saves exporting it
    again; ``texts`` (encoded, ``input_ids``): an embedder's text, which its static table's SIF weights are
    counted on (its train split is empty); ``teacher_folder``, where the teacher is saved, keeps its int8 copy in the cache for the next run of
    the same teacher on the same dev rows (:func:`distillery.export.kept_exports_folder`). Measure the models with
    ``bench.benchmark`` beside teacher and student."""
    if task_data.dev is None:
        raise DistilleryError(f"No dev split of task {task_data.task.name} was prepared, so the live baselines "
                              "cannot be scored.")
    out = LiveBaselines()
    if teacher_int8 is not None:
        out[INT8_NAME] = (teacher_int8[0], dict(teacher_int8[1]))
        out.info[INT8_NAME] = {"format": "given"}
    else:
        _int8_baseline(teacher, tokenizer, task_data, teacher_metrics, int8_format, out, teacher_folder)
    if not static:
        return out
    started = time.time()
    kind = task_data.task.kind_object
    if kind.static_table_baseline:  # an embedder: the table is the model, scored as its student is
        model, _ = model2vec_embedder(teacher, tokenizer, texts, pca_dims, EMBEDDER_SIF if texts is not None else None,
                                      seed=0, batch_size=batch_size)
        out[STATIC_NAME] = (model.eval(), score(model, task_data))
        out.info[STATIC_NAME] = {"model_type": model.config.model_type, "vocab_size": model.config.vocab_size,
                                 "dim": model.config.hidden_size, "pca_dims": model.config.pca_dims,
                                 "sif": model.config.sif, "seconds": round(time.time() - started, 1)}
        return out
    if kind.static_head is None:
        out.notes.append(f"No static-embedding baseline on {task_data.task.name} "
                         f"({task_data.task.kind_object.pipeline_tag}): {task_data.task.kind_object.no_static_baseline}, "
                         f"so only the int8 teacher is compared.")
        return out
    model = static_embedding_baseline(teacher, tokenizer, task_data, pca_dims=pca_dims, sif=sif, batch_size=batch_size)
    out[STATIC_NAME] = (model, score(model, task_data))
    out.info[STATIC_NAME] = {**model.config.to_dict(), "seconds": round(time.time() - started, 1)}
    return out
