"""What a task kind decides (:class:`TaskKind`).

A kind module imports, at its top, nothing of the data, training or evaluation layers: a task's kind is looked up
while ``distillery.data.tasks`` builds its task registry, before those layers are loaded. Where a kind calls into
them (encoding, SQuAD's answer extraction), it imports inside the method; this module and the registry, which the
data layer imports, never do.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
from torch import Tensor

from distillery.metrics import compute_metrics
from distillery.modeling import Head


def output_field(outputs: Any, name: str) -> Tensor | None:
    """The field ``name`` of a model output or a dict; None where it has none."""
    if isinstance(outputs, Mapping):
        return outputs.get(name)
    return getattr(outputs, name, None)


def arrow_column(dataset, name: str):
    """Column ``name`` of a ``datasets.Dataset``'s rows (its selection, in order) as Arrow data, read without
    Python rows (and without the data layer, which imports this module)."""
    return dataset.select_columns([name]).with_format("arrow")[:][name]


def logits_of(outputs: Any) -> Tensor:
    """The logits tensor of a model output, a dict, or the tensor itself."""
    if isinstance(outputs, Tensor):
        return outputs
    logits = output_field(outputs, "logits")
    if logits is None:
        raise ValueError(f"expected logits or an output with a 'logits' field, got {type(outputs).__name__}.")
    return logits


class TaskKind:
    """A kind of task (what its model predicts) and every decision that depends on it: the head, encoding,
    the task loss and the distillation term, predictions and metrics, the chance level, how the teacher labels
    new rows, the budgets' data settings, the static-embedding baseline's head and the Hub's pipeline tag.
    One instance a kind, registered by name in :data:`distillery.kinds.KINDS`; a ``TaskSpec`` names its kind
    (``spec.kind``, the string runs record) and ``spec.kind_object`` is this object."""

    name: ClassVar[str]
    head: ClassVar[Head]  # the model head it is trained with: its Auto class, output fields (ONNX outputs too)
    pipeline_tag: ClassVar[str]  # the Hub's name of what the model does (the model card's pipeline_tag)
    library_name: ClassVar[str] = "transformers"  # the library its student loads with (the model card's library_name)
    metrics: ClassVar[tuple[str, ...]]  # every metric a task of this kind may be scored with (distillery.metrics)
    main_metrics: ClassVar[tuple[str, ...]]  # those every dev set gives, which a main metric must be one of
    label_dtype: ClassVar[str | None] = None  # the raw label column's type (datasets' name); None: no label column
    # Whether the student's text may hold new rows the teacher labels (augmented, unlabeled: ``--augment``,
    # ``--unlabeled-file``), their placeholder labels (:meth:`unlabelled`) replaced by the teacher's.
    takes_new_rows: ClassVar[bool] = True
    # Whether the teacher's outputs on the train split are cached, one entry a row (the ``teacher_logits`` column:
    # one vector a sentence, or one a word for token classification), for the distillation term to read instead of
    # running the teacher (:meth:`cached_teacher_outputs`).
    caches_teacher_outputs: ClassVar[bool] = True
    # Whether the budgets' and deep cuts' default augmentation applies (measured on GLUE's sentence tasks only).
    augments_by_default: ClassVar[bool] = True
    pooled_output: ClassVar[bool] = True  # the head reads the first token's (pooled) state only
    needs_offsets: ClassVar[bool] = False  # encoding maps tokens back to characters: a fast tokenizer only
    scores_in_percent: ClassVar[bool] = False  # its scores are percentages (else fractions and correlations)
    finetunes_teacher: ClassVar[bool] = True  # the teacher is fine-tuned on the task (else used as it is given)
    # a pretrained student (distill --student) of another hidden size than the teacher's learns through a learned
    # projection of its last hidden states onto the teacher's width, in the loss only (an embedder's sentence vectors:
    # mean pooling is linear, so it is the pooled vector's projection); a head's outputs have no hidden width
    projects_width: ClassVar[bool] = False
    # the run exports the student (int8, --export; the module :meth:`export_module` gives) and measures the free
    # baselines beside it
    exports: ClassVar[bool] = True
    # the distillation term compares class distributions softened by a temperature (whose value can be read
    # from the teacher's own logits: distillery.distill.deep_cut)
    softened_outputs: ClassVar[bool] = False
    static_head: ClassVar[str | None] = None  # the static-embedding baseline's head; None: the kind has none
    # why a kind has no static-embedding baseline (the report's note), where it has none
    no_static_baseline: ClassVar[str] = "a bag of token vectors has no answer span to point at"
    # the static-embedding baseline is the table of the teacher's token vectors itself, with no head (an embedder's:
    # method static's start, distillery.static.vectors.model2vec_embedder)
    static_table_baseline: ClassVar[bool] = False
    word_labels: ClassVar[bool] = False  # its labels sit on words (data.label_all_subwords applies)
    # The budgets' data settings: the teacher's examples at the quick budget, the longest input by budget, the
    # quick teacher's learning rate, and a document stride by budget where inputs are windows of a document.
    quick_train_limit: ClassVar[int] = 20000
    max_lengths: ClassVar[Mapping[str, int]] = {"quick": 128, "full": 128}
    doc_strides: ClassVar[Mapping[str, int] | None] = None
    quick_teacher_lr: ClassVar[float] = 5e-5
    student_lr: ClassVar[float] = 1e-4  # the student's learning rate at both budgets (a method's budgets may set theirs)
    pretrained_student_lr: ClassVar[float | None] = None  # distill --student's, where not student_lr
    # Method prune's defaults for the kind: the share of each layer's heads its selection keeps at least (--option
    # min_heads), and the weight of its fine-tuning's hidden-state term at any speed-up (past 2x the deep-cut rule's)
    prune_head_floor: ClassVar[float] = 0.0
    prune_hidden_weight: ClassVar[float] = 0.0

    def __repr__(self) -> str:
        return f"<task kind {self.name}>"

    def num_labels(self, task) -> int:
        """The width of the head's output for ``task`` (0: the head's outputs are not labels)."""
        return 0

    def head_config(self, task) -> dict:
        """Config overrides that give a model the head of ``task``."""
        return {}

    def takes_outputs(self, outputs: int) -> bool:
        """Whether a head (:attr:`head`) of ``outputs`` outputs is one of this kind (:func:`kind_for_head`): any
        width, unless kinds share a head."""
        return True

    def head_words(self, task) -> str:
        """What the head of ``task`` predicts, in a sentence that compares it with a model's."""
        raise NotImplementedError

    def budget_data(self, budget: str, single_sentence: bool) -> dict[str, Any]:
        """The data settings of ``budget`` (dotted under ``data.``): the teacher's examples, the longest input
        (shorter for single sentences at the quick budget) and the document stride where there is one."""
        quick = budget == "quick"
        max_length = 64 if quick and single_sentence else self.max_lengths[budget]
        return {"train_limit": self.quick_train_limit if quick else None, "max_length": max_length,
                **({"doc_stride": self.doc_strides[budget]} if self.doc_strides else {})}

    def raw_features(self, task):
        """The ``datasets.Features`` of the task's raw rows (what ``distillery.data.loading`` returns): ``text``,
        ``text_pair`` (pair tasks only) and ``label`` of :attr:`label_dtype`."""
        import datasets  # here: the registry is imported before the data layer (the module docstring)

        cols = {"text": datasets.Value("string")}
        if task.is_pair:
            cols["text_pair"] = datasets.Value("string")
        cols["label"] = datasets.Value(self.label_dtype)
        return datasets.Features(cols)

    def check_data(self, task, data_config) -> None:
        """Refuse, before anything is loaded, data settings the kind cannot learn from (an embedder's missing text)."""

    def check_teacher(self, name: str, folder: str) -> None:
        """Refuse a teacher (``name``, resolved to ``folder``) whose own files say it computes something else than
        the kind distils (an embedder's pooling)."""

    def settle_data(self, name: str, folder: str | None, data_config, model_config=None) -> None:
        """Set in ``data_config`` what the model ``name`` (its ``folder`` or Hub id, or its ``model_config``) decides
        of how the run's data is read (an embedder's pooling), refusing a setting given that contradicts it, and a
        model :meth:`check_teacher` refuses."""
        if folder is not None:
            self.check_teacher(name, folder)

    def mark_config(self, model_config, data_config) -> None:
        """Record on a model's config what the run's data settings make it compute (an embedder's pooling), so that
        its exports and saved files compute the same."""

    def usage_code(self, model_id: str, student_config, own_type: bool) -> list[str] | None:
        """The model card's Python lines loading a student of this kind (``student_config``) from ``model_id`` and
        running it, where it loads otherwise than by transformers' Auto class of its head (an embedder, by
        sentence-transformers); ``own_type``: its model type is distillery's, known after
        ``distillery.register_models()``. None: the card's own snippet of the head's Auto class."""
        return None

    def write_files(self, folder, max_length: int) -> None:
        """Add the kind's files to a model saved in ``folder`` (an embedder's sentence-transformers modules)."""

    def batch_outputs(self, fields: tuple[Tensor, ...], batch: Mapping[str, Tensor]) -> tuple[Tensor, ...]:
        """A batch's outputs as :meth:`predictions` collects them, given the head's output ``fields`` and the batch
        (an embedder pools its hidden states over the batch's attention mask): the fields as they are."""
        return fields

    def output_fields(self, outputs) -> tuple[str, ...]:
        """The fields of a model's ``outputs`` that :meth:`batch_outputs` reads: the head's."""
        return self.head.outputs

    def export_module(self, model):
        """The module an export of ``model`` writes (its graph's outputs: the module's ``export_head``, else the
        model's head): the model itself; an embedder, the encoder with its pooling."""
        return model

    def check_encoding(self, tokenizer, pair_mode: str) -> None:
        """Refuse a tokenizer or pair mode the kind cannot be encoded with, before any file is read."""

    def encode(self, task, raw, tokenizer, data_config, pair_mode: str, split_name: str, train: bool):
        """The raw rows of one split encoded for ``tokenizer`` (``train``: the train split, else a dev split)."""
        raise NotImplementedError

    def task_loss(self, outputs: Any, batch: Mapping[str, Tensor], reduction: str = "mean") -> Tensor:
        """The supervised loss against the batch's gold targets (``reduction="none"``: one a row)."""
        raise NotImplementedError

    def importance_loss(self, outputs: Any, batch: Mapping[str, Tensor]) -> Tensor:
        """One loss a row whose first-order change scores a unit's importance (MoEBERT's Eq. 4,
        :mod:`distillery.importance`): the task loss against the gold targets; rows must not interact."""
        return self.task_loss(outputs, batch, reduction="none")

    def distillation_term(self, student_out: Any, teacher_out: Any, temperature: float, distribution_loss) -> Tensor:
        """The distillation term on the outputs: ``distribution_loss(student, teacher, T)`` over each
        distribution the head predicts (soft cross-entropy, KL, ...: ``training.losses``)."""
        raise NotImplementedError

    def distilled_positions(self, student_out: Any, teacher_out: Any, batch: Mapping[str, Tensor]):
        """The outputs the distillation term compares, given the ``batch`` they were computed on: all of them
        (a sentence kind's one vector a row, QA's windows); token classification keeps each word's first
        sub-word only."""
        return student_out, teacher_out

    def distillation_gap(self, student_out: Any, teacher_out: Any, temperature: float, kl) -> dict[str, float]:
        """``{"kl": ...}`` for the training log beside the distillation term (``kl``: that loss's KL form)."""
        return {"kl": float(self.distillation_term(student_out, teacher_out, temperature, kl))}

    def loss_words(self, kd_weight: float, temperature: float) -> str:
        """The task and distillation terms as the report's notes write them."""
        return f"(1-{kd_weight:g})·CE + {kd_weight:g}·KD(T={temperature:g})"

    def cached_teacher_outputs(self, logits: Tensor):
        """A batch's cached ``teacher_logits`` as the teacher's outputs."""
        return SimpleNamespace(logits=logits)

    def cached_rows(self, outputs, train) -> np.ndarray:
        """The teacher's outputs on the encoded ``train`` split (:meth:`predictions` of it) as its cache keeps them:
        float32, one row a train row, a tuple of fields (SQuAD's start and end logits) side by side."""
        if isinstance(outputs, tuple):
            outputs = np.concatenate(outputs, axis=1)
        return np.asarray(outputs, dtype=np.float32).reshape(len(train), -1)

    def teacher_logits_column(self, cached: np.ndarray, train):
        """The ``teacher_logits`` column of ``train`` from its cached rows (:meth:`cached_rows`)."""
        return cached.tolist()

    def cached_predictions(self, train) -> np.ndarray:
        """``train``'s ``teacher_logits`` column as one float32 row a prediction (a sentence's; a tagger's, a word's),
        what the teacher's temperature is read from (``distill.deep_cut``)."""
        return np.asarray(arrow_column(train, "teacher_logits").to_pylist(), dtype=np.float32)

    def unlabelled(self, raw):
        """New raw rows (augmented, unlabeled) with the placeholder labels the teacher's replace."""
        return raw.add_column("label", [self.placeholder_label()] * len(raw))

    def new_row_labels(self, rows):
        """The ``labels`` column of encoded new ``rows`` from their ``teacher_logits``: the teacher's labels."""
        return self.teacher_labels(self.cached_predictions(rows)).tolist()

    def carried_teacher_logits(self, labelled, other, originals: int):
        """The ``teacher_logits`` of ``labelled`` (the teacher's encoding of the student's rows) for ``other``,
        another tokenizer's encoding of the same rows in the same order (a pretrained student's); None where the
        two do not line up: another number of rows, or other gold labels on the first ``originals``."""
        if len(labelled) != len(other):
            return None
        gold = [np.asarray(arrow_column(d.select(range(originals)), "labels").to_pylist(), dtype=np.float64)
                for d in (labelled, other)]
        return labelled["teacher_logits"] if np.allclose(*gold) else None

    def predictions(self, chunks: list[tuple[np.ndarray, ...]], restore, task):
        """The model's outputs over a split from per-batch ``chunks`` (a tuple of the head's output fields a
        batch), ``restore`` putting rows back in dataset order."""
        raise NotImplementedError

    def scores(self, task_data, predictions) -> dict[str, float]:
        """Every metric of the task for ``predictions`` (:meth:`predictions`) on the prepared dev split."""
        raise NotImplementedError

    def chance(self, task_data) -> tuple[np.ndarray, str] | None:
        """Predictions on the dev split of a model that learned nothing, and what it predicts; None where
        the kind has no such constant answer."""
        return None

    def chance_scores(self, task_data, predictions) -> dict[str, float]:
        """Every metric of the chance predictions (:meth:`chance`) on the prepared dev split."""
        return compute_metrics(task_data.task, predictions, task_data.labels("dev"))

    def dev_size(self, task_data) -> int:
        """How many examples the main metric averages over on the dev split (its raw examples: one a sentence or pair,
        one a SQuAD question however many windows it takes), which the chance level's margin and a dev score's
        sampling interval shrink with."""
        if task_data.dev_examples is not None:
            return len(task_data.dev_examples)
        return len(task_data.dev) if task_data.dev is not None else 0

    def tie_metrics(self, task_data) -> dict[str, int]:
        """The metrics besides the main one that a point must also not fall behind on to be tied with the most
        accurate one (``--method auto``'s tie rule), each with the number of dev examples it averages over: none for
        most kinds, an embedder's retrieval."""
        return {}

    def placeholder_label(self):
        """The label a new row carries until the teacher labels it."""
        raise NotImplementedError

    def teacher_labels(self, logits: np.ndarray) -> np.ndarray:
        """The labels the teacher's cached logits give new rows."""
        raise NotImplementedError
