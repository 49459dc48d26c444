"""Sentence embeddings: the model reads one text and gives one vector for it (its last hidden states pooled: by
default their mean over the text's tokens, or the first token's, ... as sentence-transformers' Pooling modes; unit
length), as a sentence-transformers embedder does; no labels.

The teacher is an embedder (a sentence-transformers folder, whose ``modules.json`` and pooling config are read and
must say one pooling mode, or any encoder, mean-pooled unless ``data.pooling`` says otherwise) and is never
fine-tuned; the run pools as the teacher does, and so does its student (:data:`POOLINGS`). The student learns the
teacher's vector of each text: ``(1 − cos(ŝ, t̂)) + MSE(ŝ, t̂)`` on the unit vectors (on unit vectors the MSE is
``2(1 − cos)/d``: the two terms agree, the MSE keeps sentence-transformers' distillation recipe's form). The texts are the student's new rows
(``--unlabeled-file``: a corpus slice, ``distillery transfer-set --single``); the task's own train split is empty.
The teacher's vectors are computed once and cached by content as every kind's teacher outputs are
(``teacher_logits``: one vector a text).

Scores need no labels trained on: the dev split is a list of texts with their roles (``role``: an STS-B dev pair's
first or second sentence, a SQuAD dev question or a distinct paragraph; ``target``: the row of its partner or its
gold paragraph), built by ``distillery.data.loading``; :meth:`Embedding.scores` gives the Spearman and Pearson
correlation of the pairs' cosines with STS-B's gold scores (the main metric: Spearman) and retrieval of each question's
paragraph among all of them (MRR@10, recall@1, recall@10), each in one matrix product.

The student is saved as a sentence-transformers folder (:meth:`Embedding.write_files`), so
``SentenceTransformer(folder).encode(texts)`` gives the vectors distillery scored. Its exports (ONNX, int8) are of
the encoder with its pooling and normalisation (:class:`PooledEncoder`): the graph gives the sentence vector itself
(``sentence_embedding``), parity-checked against torch and scored like the student.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from distillery.config import SENTENCE_POOLINGS
from distillery.errors import DistilleryError
from distillery.kinds.base import arrow_column, output_field
from distillery.kinds.sentence import SentenceKind
from distillery.kinds.st_files import OWN_VECTOR, folder_pooling, folder_prompts, gives_own_vector
from distillery.metrics import EMBEDDING_METRICS, retrieval_scores, sts_correlations
from distillery.modeling import BASE_HEAD, SENTENCE_HEAD, SentenceEmbeddingOutput, registration_code

# The model type of method static's student (distillery.static.modeling_static), saved as sentence-transformers'
# StaticEmbedding rather than a transformer with pooling
STATIC_MODEL_TYPE = "static-embedder"

# The in-batch contrastive loss's temperature in the importance scores (Embedding.importance_loss): not the 0.05 that
# sentence-transformers' MultipleNegativesRankingLoss trains with: scored on the teacher itself, each text's own
# cosine is 1, and so sharp a softmax is saturated (texts far apart: the loss rounds to 0 in float32 and the scores
# come from the few closest pairs of a batch); at 1 every text of the batch adds to them. Not tuned.
IMPORTANCE_TEMPERATURE = 1.0

# How a sentence vector is read from the last hidden states: sentence-transformers' Pooling modes by its names (the
# mean: all-MiniLM, all-mpnet; cls: BGE, Arctic-embed; weightedmean: SGPT; lasttoken...). A run pools as its teacher's
# files say (``data.pooling``), and so does its student. The run's pooling reaches every batch as the column
# POOLING_COLUMN (its index in POOLINGS; absent: the mean), and a model keeps its own in its config
# (POOLING_ATTRIBUTE; absent: the mean), which its exports and its sentence-transformers files are written from.
POOLINGS = SENTENCE_POOLINGS
POOLING_COLUMN = "pooling"
POOLING_ATTRIBUTE = "sentence_pooling"

# sentence-transformers' prompts (``prompts``: a name -> the text put before a text, E5's "query: "; and
# ``default_prompt_name``, the one ``encode`` puts before every text). A run puts before each text the prompt its
# teacher would be called with (role_prompts); its student keeps them (PROMPTS_ATTRIBUTE: {"prompts", "default"}).
PROMPTS_ATTRIBUTE = "sentence_prompts"
# encode_query's prompt name, and encode_document's in the order it looks for them
QUERY_PROMPT, DOCUMENT_PROMPTS = "query", ("document", "passage", "corpus")

# The dev rows' roles (the ``role`` column of the raw dev split)
STS_FIRST, STS_SECOND, QUESTION, PASSAGE = 0, 1, 2, 3


def mean_pooled(hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
    """The mean of a sequence's hidden states over its tokens, padding left out: ``(B, L, d) -> (B, d)``."""
    if attention_mask is None:
        return hidden.mean(dim=1)
    mask = attention_mask.to(hidden.device, hidden.dtype).unsqueeze(-1)  # (B, L, 1)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)


def model_pooling(config) -> str:
    """How a model (its config) pools its hidden states into a sentence vector: :data:`POOLING_ATTRIBUTE`, else mean."""
    return getattr(config, POOLING_ATTRIBUTE, None) or "mean"


def batch_pooling(batch) -> str:
    """How the run that made ``batch`` pools: the pooling :data:`POOLING_COLUMN` names (its index in
    :data:`POOLINGS`), else the mean."""
    flags = batch.get(POOLING_COLUMN) if hasattr(batch, "get") else None
    return "mean" if flags is None else POOLINGS[int(torch.as_tensor(flags).reshape(-1)[0])]


def pooled(hidden: Tensor, attention_mask: Tensor | None, pooling: str) -> Tensor:
    """``(B, L, d) -> (B, d)``: the hidden states pooled as sentence-transformers' Pooling module of mode ``pooling``
    (:data:`POOLINGS`) pools them, padding left out, on either side."""
    if pooling == "mean":
        return mean_pooled(hidden, attention_mask)
    if attention_mask is None:
        attention_mask = torch.ones(hidden.shape[:2], dtype=torch.int32, device=hidden.device)
    mask = attention_mask.to(hidden.device, torch.int32)  # int32: ONNX Runtime's ArgMax takes no int64 (onnxruntime#10068)
    length = hidden.shape[1]
    if pooling in ("cls", "lasttoken"):
        first = mask.argmax(dim=1)  # the first position not padding
        at = first if pooling == "cls" else length - 1 - mask.flip(1).argmax(dim=1)
        return hidden.gather(1, at.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])).squeeze(1)
    weights = mask.unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
    if pooling == "max":
        return hidden.masked_fill(weights == 0, float("-inf")).max(dim=1).values
    if pooling == "mean_sqrt_len_tokens":
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0).sqrt()
    if pooling == "weightedmean":  # the i-th token of the text weighs i (from 1), left padding not counted
        positions = torch.arange(1, length + 1, device=hidden.device, dtype=hidden.dtype).view(1, -1, 1)
        weights = weights * (positions - mask.argmax(dim=1).to(hidden.dtype).view(-1, 1, 1))
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1e-9)
    raise ValueError(f"unknown pooling {pooling!r}: one of {', '.join(POOLINGS)}")


def sentence_vectors(outputs, batch, pooling: str | None = None) -> Tensor:
    """A batch's unit sentence vectors from an encoder's outputs (pooled as ``pooling`` says, else as the batch's run
    pools: :func:`batch_pooling`), or from outputs that carry them: the cached vectors (``logits``: the teacher's,
    read from the cache), or an embedder's own (``sentence_embedding``: a CMOW embedder's, an export's), (B, d)
    float32."""
    given = output_field(outputs, "logits")
    if given is None:
        given = output_field(outputs, SENTENCE_HEAD.outputs[0])
    if given is not None:
        return F.normalize(given.float(), dim=-1)
    hidden = output_field(outputs, "last_hidden_state")
    if hidden is None:
        hidden = outputs[0]
    vectors = pooled(hidden.float(), batch.get("attention_mask"), pooling or batch_pooling(batch))
    return F.normalize(vectors, dim=-1)


class PooledEncoder(nn.Module):
    """An encoder with its pooling (:func:`model_pooling`) and normalisation, called like it (``input_ids``,
    ``attention_mask``, ``token_type_ids``) and giving ``sentence_embedding``, (B, d) unit vectors: what an
    embedder's exports compute (the ONNX graph holds the pooling; a torch-int8 export loads as one). ``config`` is the encoder's; saving
    saves the encoder (the pooling has no weights)."""

    export_head = SENTENCE_HEAD  # what the export's manifest and graph outputs name (not the encoder's head)

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.config = encoder.config

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                return_dict: bool | None = None, **kwargs) -> SentenceEmbeddingOutput:
        given = {"attention_mask": attention_mask, "token_type_ids": token_type_ids}
        outputs = self.encoder(input_ids=input_ids, **{k: v for k, v in given.items() if v is not None}, return_dict=True)
        vectors = sentence_vectors(outputs, {"attention_mask": attention_mask}, pooling=model_pooling(self.config))
        return SentenceEmbeddingOutput(sentence_embedding=vectors)

    def save_pretrained(self, folder, **kwargs) -> None:
        self.encoder.save_pretrained(folder, **kwargs)


def role_prompts(prompts: dict[str, str] | None, default: str | None) -> dict[int | None, tuple[str, ...]]:
    """What is put before a text of each dev role, as sentence-transformers' encode (STS-B's sentences),
    encode_query (a question) and encode_document (a paragraph) put it, and (key None) before the transfer set's texts,
    in turn: each of those forms, so that the student learns the teacher's vector of a text in every form it is
    called with."""
    prompts = prompts or {}
    plain = prompts.get(default, "") if default else ""
    query = prompts.get(QUERY_PROMPT, plain)
    document = next((prompts[n] for n in DOCUMENT_PROMPTS if n in prompts), plain)
    return {STS_FIRST: (plain,), STS_SECOND: (plain,), QUESTION: (query,), PASSAGE: (document,),
            None: tuple(dict.fromkeys((plain, query, document)))}


def prompted(raw, prompts: dict[int | None, tuple[str, ...]]):
    """The raw rows with the prompt of each (:func:`role_prompts`) before its text: by its ``role`` where it has one,
    else the transfer set's forms in turn, row by row."""
    if not any(p for forms in prompts.values() for p in forms):
        return raw
    roles = "role" in raw.column_names
    cycle = prompts[None]

    def add(batch, indices):
        before = ([prompts[r][0] for r in batch["role"]] if roles else [cycle[i % len(cycle)] for i in indices])
        return {"text": [p + t for p, t in zip(before, batch["text"])]}

    return raw.map(add, batched=True, with_indices=True)


def embedding_distance(student: Tensor, teacher: Tensor) -> Tensor:
    """``mean_i (1 − cos(s_i, t_i)) + MSE(ŝ, t̂)`` over unit vectors (the module docstring)."""
    if student.shape != teacher.shape:
        raise ValueError(f"The student's sentence vectors have {student.shape[-1]} dimensions and the teacher's "
                         f"{teacher.shape[-1]}: a student of another width learns through a projection (projects_width).")
    s, t = F.normalize(student.float(), dim=-1), F.normalize(teacher.float().to(student.device), dim=-1)
    return (1 - (s * t).sum(dim=-1)).mean() + F.mse_loss(s, t)


class Embedding(SentenceKind):
    name = "embedding"
    head = BASE_HEAD  # the bare encoder: its last hidden states, pooled
    pipeline_tag = "sentence-similarity"
    library_name = "sentence-transformers"  # its folder is a sentence-transformers model (write_files)
    metrics = EMBEDDING_METRICS
    main_metrics = ("sts_spearman", "sts_pearson")  # STS-B dev is always read; SQuAD's retrieval too, so far
    label_dtype = "float32"  # a placeholder: a text's target is the teacher's vector (teacher_logits)
    finetunes_teacher = False
    projects_width = True  # a student of another width learns through a projection used in the loss only
    augments_by_default = False
    pooled_output = False
    static_head = None
    static_table_baseline = True
    # SQuAD paragraphs are long: the quick budget's 64 tokens of single sentences would cut most of them
    max_lengths = {"quick": 128, "full": 256}
    # A layer-drop student learning the teacher's vectors from a few thousand texts is far from converged at the
    # sentence tasks' 1e-4: on held-out STS-B train pairs (not the benchmark's dev), 3 of MiniLM's 6 layers after
    # one pass over 8,000 Wikipedia sentences kept 84.8 % of the teacher's Spearman at 1e-4 and 90.1 % at 5e-4
    # (16,000 sentences at 5e-4: 93.5 %; docs/embedding.md, "Recipe").
    student_lr = 5e-4
    # A pretrained student (distill --student) is an embedder already: the rate that re-fits a cut stack of the
    # teacher's layers bends its own space out of shape. On the held-out rows (docs/embedding.md, "A pretrained
    # student of another width"), all-MiniLM-L6-v2 taught all-mpnet-base-v2's vectors from 4,000 sentences, its map
    # started at least squares: STS-B train Spearman 0.906 / MRR@10 0.729 at 5e-4, 0.914 / 0.751 at 1e-4, 0.914 /
    # 0.756 at 3e-5 (MiniLM as it is: 0.912 / 0.761).
    pretrained_student_lr = 3e-5
    # Pruned to 2x by Fisher information per latency saved, an embedder lost most on retrieval: the selection kept 1
    # to 5 of 12 heads in five of six layers, and attention is what mixes a long paragraph into its vector. On
    # held-out rows (STS-B train pairs, SQuAD dev questions 3,000-4,499; docs/embedding.md, "Recipe") half the heads
    # kept a layer took MRR@10 from 92.0 to 94.5 % of the teacher's, and each pruned layer also learning its teacher
    # layer's hidden states to 95.0 % (STS-B Spearman 97.5 -> 98.8 %).
    prune_head_floor = 0.5
    prune_hidden_weight = 1.0

    def takes_outputs(self, outputs: int) -> bool:
        return False  # a bare encoder is no embedding head: a model is known as an embedder by its folder only

    def head_words(self, task) -> str:
        return "sentence embeddings"

    def budget_data(self, budget, single_sentence):
        return {"train_limit": None, "max_length": self.max_lengths[budget]}

    def check_data(self, task, data_config) -> None:
        if not data_config.unlabeled_file:
            raise DistilleryError("--task embedding learns from text alone and none was given: give the texts with "
                                  "--unlabeled-file FILE (a 'text' column; `distillery transfer-set --single` "
                                  "writes one from a corpus).")

    def check_teacher(self, name: str, folder: str) -> None:
        folder_pooling(name, folder)

    def settle_data(self, name: str, folder: str | None, data_config, model_config=None) -> None:
        """``data_config.pooling``: the model's own (its sentence-transformers files, :func:`folder_pooling`, else its
        config's :data:`POOLING_ATTRIBUTE`); a plain encoder pools as ``data.pooling`` says (default the mean). A
        ``data.pooling`` its own files contradict is refused; the mean is kept as None (the default)."""
        own = folder_pooling(name, folder) if folder is not None else None  # refuses what check_teacher refuses
        if own is None and model_config is not None and getattr(model_config, POOLING_ATTRIBUTE, None):
            own = model_pooling(model_config)
        given = data_config.pooling
        if own is not None and given is not None and given != own:
            raise DistilleryError(f"--pooling {given} (data.pooling), but {name} pools its sentence vectors by {own} "
                                  f"(its own files say so): drop it.")
        chosen = own or given
        data_config.pooling = None if chosen in (None, "mean") else chosen
        prompts, default = folder_prompts(name, folder) if folder is not None else ({}, None)
        saved = getattr(model_config, PROMPTS_ATTRIBUTE, None) if model_config is not None else None
        if not prompts and saved:
            prompts, default = dict(saved.get("prompts") or {}), saved.get("default")
        given_prompts = (data_config.prompts or {}, data_config.default_prompt)
        if prompts and any(given_prompts) and given_prompts != (prompts, default):
            raise DistilleryError(f"data.prompts / data.default_prompt given, but {name} has prompts of its own "
                                  f"({prompts}, default {default}; its own files say so): drop them.")
        if prompts:
            data_config.prompts, data_config.default_prompt = prompts, default
        data_config.prompts = data_config.prompts or None

    def mark_config(self, model_config, data_config) -> None:
        if getattr(data_config, "pooling", None) not in (None, "mean"):
            setattr(model_config, POOLING_ATTRIBUTE, data_config.pooling)
        if getattr(data_config, "prompts", None):
            setattr(model_config, PROMPTS_ATTRIBUTE, {"prompts": dict(data_config.prompts),
                                                      "default": data_config.default_prompt})

    def encode(self, task, raw, tokenizer, data_config, pair_mode, split_name, train):
        """The texts encoded as a sentence task's, each after its prompt (:func:`role_prompts`), with
        :data:`POOLING_COLUMN` where the run pools other than by the mean."""
        raw = prompted(raw, role_prompts(getattr(data_config, "prompts", None),
                                         getattr(data_config, "default_prompt", None)))
        if len(raw):
            encoded = super().encode(task, raw, tokenizer, data_config, pair_mode, split_name, train)
        else:  # the empty train split: no rows, the columns one encoded row has (datasets maps nothing over none)
            one = raw.from_dict({"text": ["."], "label": [0.0]}, features=raw.features)
            encoded = super().encode(task, one, tokenizer, data_config, pair_mode, split_name, train).select([])
        pooling = getattr(data_config, "pooling", None) or "mean"
        if pooling == "mean":
            return encoded
        return encoded.add_column(POOLING_COLUMN, np.full(len(encoded), POOLINGS.index(pooling), dtype=np.int8))

    def task_loss(self, outputs, batch, reduction="mean"):
        if "teacher_logits" not in batch:
            raise ValueError("an embedding batch needs the teacher's vectors (teacher_logits): its only target.")
        student = sentence_vectors(outputs, batch)
        if reduction == "none":
            return 1 - (student * F.normalize(batch["teacher_logits"].float().to(student.device), dim=-1)).sum(-1)
        return embedding_distance(student, batch["teacher_logits"])

    def importance_loss(self, outputs, batch):
        """``−log softmax_j(cos(s_i, t_j) / τ)_i`` a row, the teacher's vectors of the batch ``t_j`` held constant (each
        row's loss reads its own pass only). The task loss would score nothing: the units are scored on the teacher,
        whose vectors are the targets, where ``1 − cos`` is at its minimum and its gradient 0; this one is not, and
        it scores a unit by how much it keeps each text's vector apart from the batch's other texts'."""
        if "teacher_logits" not in batch:
            raise ValueError("an embedding batch needs the teacher's vectors (teacher_logits): its only target.")
        student = sentence_vectors(outputs, batch)
        teacher = F.normalize(batch["teacher_logits"].float().to(student.device), dim=-1)
        similarity = student @ teacher.T / IMPORTANCE_TEMPERATURE  # (B, B)
        return F.cross_entropy(similarity, torch.arange(len(student), device=student.device), reduction="none")

    def distilled_positions(self, student_out, teacher_out, batch):
        return sentence_vectors(student_out, batch), sentence_vectors(teacher_out, batch)

    def distillation_term(self, student_out, teacher_out, temperature, distribution_loss):
        """:func:`embedding_distance` of the sentence vectors: no distribution, no temperature."""
        return embedding_distance(student_out, teacher_out)

    def loss_words(self, kd_weight, temperature):
        return "1 − cos + MSE between the student's and the teacher's unit sentence vectors"

    def distillation_gap(self, student_out, teacher_out, temperature, kl):
        return {}  # the term is 0 at a match already

    def export_module(self, model):
        if getattr(model.config, "model_type", None) == STATIC_MODEL_TYPE:
            raise DistilleryError("A static embedder is not exported: it is one table lookup, with no matrix product "
                                  "for int8 to quantize, and its folder is its deployment (sentence-transformers' "
                                  "StaticEmbedding).")
        return PooledEncoder(model)

    def output_fields(self, outputs):
        """An export's own sentence vector where it gives one (:class:`PooledEncoder`), else the hidden states."""
        return SENTENCE_HEAD.outputs if output_field(outputs, SENTENCE_HEAD.outputs[0]) is not None else self.head.outputs

    def batch_outputs(self, fields, batch):
        if fields[0].dim() == 2:  # (B, d): pooled already, by the export itself
            return (F.normalize(fields[0].float(), dim=-1),)
        return (sentence_vectors({"last_hidden_state": fields[0]}, batch),)

    def predictions(self, chunks, restore, task):
        return restore(np.concatenate([chunk[0] for chunk in chunks]))

    def scores(self, task_data, predictions):
        raw = task_data.dev_examples
        role, target = (np.asarray(arrow_column(raw, c), dtype=np.int64) for c in ("role", "target"))
        gold = np.asarray(arrow_column(raw, "label"), dtype=np.float64)
        first = np.flatnonzero(role == STS_FIRST)
        scores = sts_correlations(predictions[first], predictions[target[first]], gold[first])
        questions, passages = np.flatnonzero(role == QUESTION), np.flatnonzero(role == PASSAGE)
        if len(questions):
            index = np.full(len(role), -1, dtype=np.int64)
            index[passages] = np.arange(len(passages))  # a row of the dev split -> its column among the passages
            scores.update(retrieval_scores(predictions[questions], predictions[passages], index[target[questions]]))
        return scores

    def dev_size(self, task_data) -> int:
        """The STS-B pairs, which the main metric's correlation is over (the dev split's rows are texts: both sides
        of each pair, SQuAD's questions and paragraphs)."""
        return _rows_of_role(task_data, STS_FIRST)

    def tie_metrics(self, task_data) -> dict[str, int]:
        """MRR@10 over the SQuAD dev questions, where the dev split holds them: an embedder tied on STS-B is not tied
        when its retrieval falls behind."""
        questions = _rows_of_role(task_data, QUESTION)
        return {"mrr_at_10": questions} if questions else {}

    def placeholder_label(self):
        return 0.0

    def teacher_labels(self, logits):
        return np.zeros(len(logits), dtype=np.float32)  # a text's target is its vector, not a label

    def dev_rows(self, sts, squad, limit: int | None):
        """The dev split's raw rows (``text``, ``label``, ``role``, ``target``) from STS-B's dev pairs (``text``,
        ``text_pair``, ``label``) and SQuAD's dev questions (``question``, ``context``), or None: at most ``limit``
        pairs and ``limit`` questions (with their paragraphs)."""
        import datasets

        sts = sts.select(range(min(len(sts), limit))) if limit else sts
        first, second = list(sts["text"]), list(sts["text_pair"])
        n = len(first)
        texts = [t for pair in zip(first, second) for t in pair]
        role, target = [STS_FIRST, STS_SECOND] * n, [x for i in range(n) for x in (2 * i + 1, 2 * i)]
        label = [x for score in sts["label"] for x in (float(score), 0.0)]
        if squad is not None:
            squad = squad.select(range(min(len(squad), limit))) if limit else squad
            contexts = list(dict.fromkeys(squad["context"]))
            start = len(texts) + len(squad)
            where = {c: start + i for i, c in enumerate(contexts)}
            texts += list(squad["question"]) + contexts
            role += [QUESTION] * len(squad) + [PASSAGE] * len(contexts)
            target += [where[c] for c in squad["context"]] + [-1] * len(contexts)
            label += [0.0] * (len(squad) + len(contexts))
        features = datasets.Features({"text": datasets.Value("string"), "label": datasets.Value("float32"),
                                      "role": datasets.Value("int64"), "target": datasets.Value("int64")})
        return datasets.Dataset.from_dict({"text": texts, "label": label, "role": role, "target": target},
                                          features=features)

    def usage_code(self, model_id, student_config, own_type):
        """``SentenceTransformer(model_id).encode(...)``, as the folder loads (:meth:`write_files`): after
        ``distillery.register_models()`` where its transformer is of a distillery model type (moebert, autotinybert, a
        CMOW embedder), which sentence-transformers' ``Transformer`` module loads through transformers' Auto classes;
        not for a static embedder, read by sentence-transformers' ``StaticEmbedding`` from its own files."""
        model_type = str(getattr(student_config, "model_type", "?"))
        static = model_type == STATIC_MODEL_TYPE
        registers = own_type and not static
        before, register = registration_code(model_type)
        code = before if registers else []
        code += ["from sentence_transformers import SentenceTransformer", ""]
        if registers:
            code += [register]
        code += [f"model = SentenceTransformer({model_id!r})  # or the path of this folder"]
        if static:
            code += ["# its first module is sentence-transformers' StaticEmbedding: one vector a token, averaged"]
        if (getattr(student_config, PROMPTS_ATTRIBUTE, None) or {}).get("prompts"):
            code += ["# its teacher's prompts are its own: model.encode_query(...) / model.encode_document(...) put "
                     "them before a text"]
        return code + ['embeddings = model.encode(["A man is playing a guitar.", "Someone plays an instrument."])',
                       "# one unit vector a text; model.similarity(embeddings, embeddings) gives their cosines"]

    def write_files(self, folder: Path, max_length: int) -> None:
        """Make the saved encoder in ``folder`` a sentence-transformers model (modules.json, its pooling
        (:data:`POOLING_ATTRIBUTE`: the run's), normalisation; its tokenizer reads ``max_length`` tokens, as
        distillery scored it), written by sentence-transformers itself; a static embedder (:data:`STATIC_MODEL_TYPE`) as ``StaticEmbedding``; a model
        giving its own sentence vector (:func:`gives_own_vector`) as sentence-transformers' transformer module
        reading that vector (:data:`OWN_VECTOR`: no pooling), then normalisation."""
        config = json.loads((Path(folder) / "config.json").read_text())
        if config.get("model_type") == STATIC_MODEL_TYPE:
            return write_static_files(Path(folder), max_length, config)
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.base.modules import Normalize, Transformer
        from sentence_transformers.sentence_transformer.modules import Pooling

        if gives_own_vector(config):  # its forward's sentence_embedding, with nothing to pool
            encoder = Transformer(str(folder), max_seq_length=max_length, **OWN_VECTOR)
            modules = [encoder, Normalize()]
        else:
            encoder = Transformer(str(folder), max_seq_length=max_length)
            pooling = config.get(POOLING_ATTRIBUTE) or "mean"
            modules = [encoder, Pooling(encoder.get_embedding_dimension(), pooling), Normalize()]
        SentenceTransformer(modules=modules, device="cpu", **saved_prompts(config)).save(str(folder),
                                                                                         create_model_card=False)


def _rows_of_role(task_data, role: int) -> int:
    """How many rows of the raw dev split have ``role`` (an STS-B pair's first sentence, a SQuAD question)."""
    raw = task_data.dev_examples
    return 0 if raw is None else int(np.count_nonzero(np.asarray(arrow_column(raw, "role")) == role))


def saved_prompts(config: dict) -> dict:
    """A model's prompts (its config.json, read as JSON: :data:`PROMPTS_ATTRIBUTE`) as SentenceTransformer's
    arguments."""
    saved = config.get(PROMPTS_ATTRIBUTE) or {}
    return {"prompts": saved.get("prompts") or None, "default_prompt_name": saved.get("default")}


def write_static_files(folder: Path, max_length: int, config: dict) -> None:
    """sentence-transformers' files for a static embedder saved in ``folder``: ``StaticEmbedding`` (the folder itself:
    its ``model.safetensors`` holds ``embedding.weight``, the one tensor both read) then ``Normalize``. Its
    tokenizer.json cuts a text at the ``max_length`` tokens distillery read, less the special tokens that
    ``StaticEmbedding`` does not add (transformers' tokenizer sets its own truncation at each call)."""
    import shutil
    import tempfile

    from safetensors.torch import load_file
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    specials = tokenizer.post_processor.num_special_tokens_to_add(False) if tokenizer.post_processor else 0
    tokenizer.enable_truncation(max_length - specials)
    module = StaticEmbedding(tokenizer, embedding_weights=load_file(str(folder / "model.safetensors"))["embedding.weight"])
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        SentenceTransformer(modules=[module, Normalize()], device="cpu", **saved_prompts(config)).save(
            tmp, create_model_card=False)
        for item in Path(tmp).iterdir():
            if item.name != "model.safetensors":  # the same tensor as the folder's own, saved without its metadata
                shutil.move(str(item), str(folder / item.name))
