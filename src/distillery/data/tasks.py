"""The task registry: what each task's data looks like, how it is scored, and where it lives.

A ``TaskSpec`` is pure description; ``distillery.data.loading`` reads files and the Hub from it.
Label strings are the ones written in the GLUE TSV files; a label's index in ``labels`` is its
class id, and the order follows the Hub's ``nyu-mll/glue`` ClassLabel names, so local files and
the Hub give the same ids (and fine-tuned Hub checkpoints keep their meaning).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from distillery.errors import DistilleryError
from distillery.kinds import KINDS, TaskKind, kind_of


@dataclass(frozen=True)
class TaskSpec:
    """One task: its kind, labels, metrics and the layout of its files."""

    name: str
    kind: str  # a name in distillery.kinds.KINDS ("classification", "qa", ...); kind_object is the kind
    labels: tuple[str, ...] | None  # label strings as in the files; index = class id
    metrics: tuple[str, ...]
    main_metric: str
    is_pair: bool = False
    dev_splits: tuple[str, ...] = ("dev",)
    squad_version: int | None = None  # 1 or 2 for SQuAD, else None
    # Local GLUE layout: <data_dir>/glue/<glue_dir>/<split>.tsv
    glue_dir: str | None = None
    has_header: bool = True
    # Where the fields are in a TSV row: a header name, or a column index for header-less files.
    text_field: str | int | None = None
    text_pair_field: str | int | None = None
    label_field: str | int | None = None
    # What each class is called (a model's id2label, which pipeline() prints), where the files write digits
    label_names: tuple[str, ...] | None = None
    # The Hub fallback: load_dataset(hub_id, hub_name), and the Hub's own column names.
    hub_id: str | None = None
    hub_name: str | None = None
    hub_text: str | None = None
    hub_text_pair: str | None = None
    hub_splits: tuple[tuple[str, str], ...] = (("train", "train"), ("dev", "validation"))
    # Custom data (task "custom"): the user's files and columns.
    train_file: str | None = None
    dev_file: str | None = None
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None
    # Token-labelled files (token classification): a folder under <data_dir>/ner/ holding {split}.txt in CoNLL's
    # layout, and custom files' columns (0-based; the tag column None: the last)
    ner_dir: str | None = None
    token_column: int | None = None
    tag_column: int | None = None
    quick_epochs: float | None = None  # the quick budget's epochs where they are not the default (distillery.pipeline)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise DistilleryError(f"Task {self.name!r} has unknown kind {self.kind!r}; use one of {', '.join(KINDS)}.")
        if self.main_metric not in self.metrics:
            raise DistilleryError(f"Task {self.name!r}: main metric {self.main_metric!r} is not one of its metrics.")
        kind = self.kind_object
        unknown = [m for m in self.metrics if m not in kind.metrics]
        if unknown:
            raise DistilleryError(f"Task {self.name!r} has metric(s) {', '.join(map(repr, unknown))} that a {self.kind} "
                                  f"task is not scored with; use {', '.join(kind.metrics)}.")
        if self.main_metric not in kind.main_metrics:
            raise DistilleryError(f"Task {self.name!r}: main metric {self.main_metric!r} is not given for every dev set "
                                  f"of a {self.kind} task; use {' or '.join(kind.main_metrics)}.")

    @property
    def kind_object(self) -> TaskKind:
        """The task's kind (:mod:`distillery.kinds`): what its head, loss, metrics, ... are."""
        return kind_of(self.kind)

    @property
    def num_labels(self) -> int:
        """Width of the model head: 1 for regression, the number of classes for classification (0 for QA)."""
        return self.kind_object.num_labels(self)

    @property
    def class_names(self) -> tuple[str, ...]:
        """The classes' names: ``label_names`` where the task has them (GLUE's digit labels), else its labels."""
        return self.label_names or tuple(self.labels or ())

    def hub_split(self, split: str) -> str:
        """The Hub's split name for one of ours ("train", "dev", or a name in ``dev_splits``)."""
        return dict(self.hub_splits)[split]


def _glue(
    name: str,
    glue_dir: str,
    labels: tuple[str, ...] | None,
    metrics: tuple[str, ...],
    main_metric: str,
    text: str | int,
    label: str | int,
    hub_text: str,
    text_pair: str | int | None = None,
    hub_text_pair: str | None = None,
    **kw,
) -> TaskSpec:
    return TaskSpec(
        name=name,
        kind="regression" if labels is None else "classification",
        labels=labels,
        metrics=metrics,
        main_metric=main_metric,
        is_pair=text_pair is not None,
        glue_dir=glue_dir,
        text_field=text,
        text_pair_field=text_pair,
        label_field=label,
        hub_id="nyu-mll/glue",
        hub_name=name,
        hub_text=hub_text,
        hub_text_pair=hub_text_pair,
        **kw,
    )


BINARY = ("0", "1")
NLI2 = ("entailment", "not_entailment")
TASKS: dict[str, TaskSpec] = {
    # CoLA has no header: source, label, original label (blank or "*"), sentence.
    "cola": _glue("cola", "CoLA", BINARY, ("mcc",), "mcc", text=3, label=1, hub_text="sentence", has_header=False,
                  label_names=("unacceptable", "acceptable"), quick_epochs=2.0),
    "sst2": _glue("sst2", "SST-2", BINARY, ("accuracy",), "accuracy", text="sentence", label="label", hub_text="sentence",
                  label_names=("negative", "positive")),
    "mrpc": _glue(
        "mrpc", "MRPC", BINARY, ("f1", "accuracy"), "f1",
        text="#1 String", text_pair="#2 String", label="Quality", hub_text="sentence1", hub_text_pair="sentence2",
        label_names=("not_equivalent", "equivalent"), quick_epochs=3.0,
    ),
    "stsb": _glue(
        "stsb", "STS-B", None, ("pearson", "spearman"), "pearson",
        text="sentence1", text_pair="sentence2", label="score", hub_text="sentence1", hub_text_pair="sentence2",
        quick_epochs=3.0,
    ),
    "qqp": _glue(
        "qqp", "QQP", BINARY, ("f1", "accuracy"), "f1",
        text="question1", text_pair="question2", label="is_duplicate", hub_text="question1", hub_text_pair="question2",
        label_names=("not_duplicate", "duplicate"),
    ),
    "mnli": _glue(
        "mnli", "MNLI", ("entailment", "neutral", "contradiction"), ("accuracy",), "accuracy",
        text="sentence1", text_pair="sentence2", label="gold_label", hub_text="premise", hub_text_pair="hypothesis",
        dev_splits=("dev_matched", "dev_mismatched"),
        hub_splits=(("train", "train"), ("dev_matched", "validation_matched"), ("dev_mismatched", "validation_mismatched")),
    ),
    "qnli": _glue(
        "qnli", "QNLI", NLI2, ("accuracy",), "accuracy",
        text="question", text_pair="sentence", label="label", hub_text="question", hub_text_pair="sentence",
    ),
    "rte": _glue(
        "rte", "RTE", NLI2, ("accuracy",), "accuracy",
        text="sentence1", text_pair="sentence2", label="label", hub_text="sentence1", hub_text_pair="sentence2",
        quick_epochs=3.0,
    ),
    "wnli": _glue(
        "wnli", "WNLI", BINARY, ("accuracy",), "accuracy",
        text="sentence1", text_pair="sentence2", label="label", hub_text="sentence1", hub_text_pair="sentence2",
        label_names=("not_entailment", "entailment"), quick_epochs=3.0,
    ),
    "squad": TaskSpec(
        name="squad", kind="qa", labels=None, metrics=("exact_match", "f1"), main_metric="f1",
        is_pair=True, squad_version=1, hub_id="rajpurkar/squad", quick_epochs=2.0,
    ),
    "squad_v2": TaskSpec(
        name="squad_v2", kind="qa", labels=None, metrics=kind_of("qa").metrics, main_metric="f1",
        is_pair=True, squad_version=2, hub_id="rajpurkar/squad_v2", quick_epochs=2.0,
    ),
    # CoNLL-2003 English NER; its tags as custom data's are named (O first, then sorted): the ids a copy of the
    # files given as --task custom gets too
    "conll2003": TaskSpec(
        name="conll2003", kind="token_classification",
        labels=("O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER"),
        metrics=kind_of("token_classification").metrics, main_metric="entity_f1", dev_splits=("dev", "test"),
        ner_dir="conll2003", hub_id="eriktnl/conll2003", hub_text="tokens",
        hub_splits=(("train", "train"), ("dev", "validation"), ("test", "test")),
    ),
    # sentence embeddings: the texts are --unlabeled-file's; scored on STS-B dev and retrieval from SQuAD dev
    "embedding": TaskSpec(
        name="embedding", kind="embedding", labels=None, metrics=kind_of("embedding").metrics,
        main_metric="sts_spearman", glue_dir="STS-B", hub_id="nyu-mll/glue", hub_name="stsb",  # the main score's
    ),
}


def get_task(name: str) -> TaskSpec:
    """The registered task called ``name`` (case-insensitive; "sst-2" works too)."""
    key = str(name).lower().replace("-", "")
    key = {"squadv2": "squad_v2", "squad2": "squad_v2"}.get(key.replace("_", ""), key)
    if key not in TASKS:
        known = ", ".join(list(TASKS) + ["custom"])
        hint = " (task 'custom' is built from your files: use custom_task)" if key == "custom" else ""
        raise DistilleryError(f"Unknown task {name!r}; known tasks are {known}{hint}.")
    return TASKS[key]


def label_sort_key(label: str):
    # Numeric labels sort by value ("2" before "10"); others alphabetically, after numbers.
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


# How tables and pandas write a missing value; as a class it would be learnt and scored like any other.
MISSING_LABELS = ("", "nan", "none", "null", "na", "n/a")


def custom_label(raw: str, where: str, column: str, regression: bool) -> str | float:
    """A custom file's label: a finite number for regression, else the class string; ``where`` is
    "file, line N" for the sentence when it is missing or not a number."""
    if raw.strip().lower() in MISSING_LABELS:
        raise DistilleryError(f"{where}: the label in column {column!r} is missing ({raw!r}).")
    if not regression:
        return raw
    try:
        value = float(raw)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value):
        raise DistilleryError(f"{where}: label {raw!r} in column {column!r} is not a number, but regression was asked for.")
    return value
