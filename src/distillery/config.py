"""Configuration as data: one dataclass per stage, validated on construction, saved as YAML.

A run folder's ``config.yaml`` is ``RunConfig.to_dict()``; ``RunConfig.from_dict`` reads it back,
so a run can be repeated or resumed from its own folder.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from distillery.errors import DistilleryError

BUDGETS = ("quick", "full")
# distillery.export's formats; "int8" is whichever int8 backend was faster where we measured.
EXPORT_FORMATS = ("onnx", "onnx-int8", "torch-int8", "int8")
DEFAULT_DATA_ENV = "DISTILLERY_DATA"


def parse_value(text: str) -> Any:
    """A command-line setting's value: YAML (numbers, lists, booleans), plus the exponent floats
    YAML 1.1 leaves as strings (``3e-4``)."""
    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path | None:
    """The local data folder: the explicit option, else ``$DISTILLERY_DATA``, else None (the Hub)."""
    value = data_dir if data_dir not in (None, "") else os.environ.get(DEFAULT_DATA_ENV) or None
    return Path(value).expanduser() if value is not None else None


@dataclass
class DataConfig:
    """Which task and data, and how to encode it."""

    task: str = "sst2"
    data_dir: str | None = None  # standard GLUE/SQuAD layout; None: $DISTILLERY_DATA, then the Hub
    max_length: int = 128
    train_limit: int | None = None  # subsample the train split (seeded) to this many examples
    dev_limit: int | None = None  # first N dev examples (for smoke runs; reports say so)
    seed: int = 42
    # custom data (task == "custom")
    train_file: str | None = None
    dev_file: str | None = None
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None
    regression: bool = False
    # SQuAD
    squad_holdout: float | None = None  # fraction of dev articles held out as dev; rest trains
    doc_stride: int = 64  # overlap of SQuAD windows (the full budget uses 128 with 384-token windows)
    max_answer_length: int = 30
    n_best: int = 20
    null_score_threshold: float = 0.0

    def __post_init__(self) -> None:
        if self.max_length < 8:
            raise DistilleryError(f"max_length must be at least 8, got {self.max_length}.")
        for name in ("train_limit", "dev_limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise DistilleryError(f"{name} must be a positive number of examples, got {value}.")
        if self.squad_holdout is not None and not 0.0 < self.squad_holdout < 1.0:
            raise DistilleryError(
                f"--squad-holdout is the fraction of dev articles kept for evaluation and must be "
                f"between 0 and 1, got {self.squad_holdout}."
            )
        # SQuAD encoding caps the stride to what each window leaves for the context.
        if self.doc_stride < 1:
            raise DistilleryError(f"doc_stride must be at least 1, got {self.doc_stride}.")

    @property
    def resolved_data_dir(self) -> Path | None:
        return resolve_data_dir(self.data_dir)


@dataclass
class TrainConfig:
    """Settings of the one training loop (``distillery.distill.trainer``)."""

    epochs: float = 1.0
    max_steps: int | None = None  # overrides epochs when set
    batch_size: int = 32  # global batch per optimizer step = batch_size * grad_accum
    grad_accum: int = 1
    group_by_length: bool = True  # batch examples of similar length: far less padding, same examples
    lr: float = 5e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.0
    max_grad_norm: float | None = 1.0
    eval_every: int | None = None  # optimizer steps; None: once at the end of each epoch
    eval_batch_size: int = 128
    select_best: bool = True  # keep the weights with the best dev main metric
    patience: int | None = None  # early stopping: stop after this many evaluations without a new best
    seed: int = 42
    log_every: int = 50  # optimizer steps between log lines (the progress bar updates every step)
    tensorboard: bool = False

    def __post_init__(self) -> None:
        if self.epochs <= 0 and not self.max_steps:
            raise DistilleryError(f"epochs must be positive, got {self.epochs}.")
        if self.batch_size < 1 or self.grad_accum < 1:
            raise DistilleryError("batch_size and grad_accum must be at least 1.")
        if self.lr <= 0:
            raise DistilleryError(f"learning rate must be positive, got {self.lr}.")
        if self.patience is not None and self.patience < 1:
            raise DistilleryError(f"patience must be at least 1 evaluation (or unset), got {self.patience}.")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise DistilleryError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}.")


@dataclass
class TeacherConfig:
    """Which teacher, and how to fine-tune it when it is not fine-tuned for the task yet."""

    name: str = "minilm"  # "minilm" (packaged all-MiniLM-L6-v2), a local folder, or a Hub id
    finetuned: bool = False  # the given teacher already has the task head: use it as it is
    train: TrainConfig = field(default_factory=TrainConfig)


@dataclass
class RunConfig:
    """Everything ``distillery compress`` needs; written to the run folder as config.yaml."""

    method: str = "distill"
    budget: str = "quick"
    out: str | None = None
    data: DataConfig = field(default_factory=DataConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    student: TrainConfig = field(default_factory=TrainConfig)
    method_options: dict[str, Any] = field(default_factory=dict)
    bench: dict[str, Any] = field(default_factory=dict)  # overrides of distillery.bench defaults
    export: list[str] = field(default_factory=list)  # deployment variants measured beside teacher and student

    def __post_init__(self) -> None:
        if self.budget not in BUDGETS:
            raise DistilleryError(f"Unknown budget {self.budget!r}; choose one of {', '.join(BUDGETS)}.")
        if isinstance(self.export, str):
            self.export = [self.export]
        unknown = [f for f in self.export or [] if f not in EXPORT_FORMATS]
        if unknown:
            raise DistilleryError(f"Unknown export format {unknown[0]!r}; choose one of {', '.join(EXPORT_FORMATS)}.")
        self.export = list(self.export or [])

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunConfig":
        d = dict(d)
        teacher = dict(d.pop("teacher", {}) or {})
        teacher_train = TrainConfig(**(teacher.pop("train", {}) or {}))
        return cls(
            data=DataConfig(**(d.pop("data", {}) or {})),
            teacher=TeacherConfig(train=teacher_train, **teacher),
            student=TrainConfig(**(d.pop("student", {}) or {})),
            **d,
        )

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RunConfig":
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError:
            raise DistilleryError(f"No config file at {path}.") from None
        except yaml.YAMLError as e:
            raise DistilleryError(f"{path} is not valid YAML: {e}") from None
        if not isinstance(raw, dict):
            raise DistilleryError(f"{path} must hold a mapping of settings.")
        try:
            return cls.from_dict(raw)
        except TypeError as e:
            raise DistilleryError(f"{path}: {e}") from None
