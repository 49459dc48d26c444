"""What the pipeline hands to a compression method, and the registry of methods.

A method is a module with ``run(ctx: MethodContext) -> PreTrainedModel``, which builds a student from
``ctx.teacher`` and trains it with the one trainer, its options as a :class:`MethodOptions` dataclass
(``options(config)`` reads them from ``config.method_options``), and optionally ``check(config, teacher_config)``,
which rejects impossible options before minutes are spent fine-tuning the teacher,
``budget_overrides(budget, task)`` (nested settings the method changes in a budget's defaults) and
``preset_overrides(name, task)`` (dotted settings of a named preset, e.g. a paper's table), and
``TEACHER_OUTPUTS_ONLY = True`` when it reads nothing of the teacher but its outputs (then an ONNX or int8
export is a teacher too; any other method is given a PyTorch model folder). The pipeline does everything around it
(data, teacher, evaluation, benchmark, saving, report), so a method holds only what its paper adds.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

from transformers import PreTrainedModel

import distillery.distributed as distributed
from distillery.config import RunConfig
from distillery.data.encode import TaskData, content_digest
from distillery.errors import DistilleryError
from distillery.folders import atomic_file, writing

logger = logging.getLogger("distillery")

# name -> module. Imported lazily so a method's extra dependencies load only when used.
METHODS: dict[str, str] = {
    "distill": "distillery.baseline",
    "moebert": "distillery.moebert.recipe",
    "cmow": "distillery.cmow.recipe",
    "autotinybert": "distillery.autotinybert.recipe",
}


@dataclass
class MethodContext:
    config: RunConfig
    teacher: PreTrainedModel  # fine-tuned on the task, eval mode
    tokenizer: Any
    task_data: TaskData  # encoded train/dev of the task, with the teacher's tokenizer
    out_dir: Path  # the run folder; the trainer keeps its checkpoints in out_dir/"checkpoints"
    resume: bool = False
    notes: list[str] = field(default_factory=list)  # lines a method wants in the report
    student_examples: int | None = None  # what the student last trained on (:meth:`train`), for the report

    @property
    def options(self) -> dict[str, Any]:
        return self.config.method_options

    def train(self, student: PreTrainedModel, loss_fn, *, desc: str, train_dataset=None, collate_fn=None,
              **settings) -> PreTrainedModel:
        """Train ``student`` with the one trainer and return it: the task's train split (or
        ``train_dataset`` / ``collate_fn``), the student settings (``settings``: fields of them the
        method sets otherwise, e.g. ``lr``), checkpoints in the run folder, dev scored with the task's
        main metric at each evaluation; the teacher follows the student to the trainer's device."""
        # Imported here: the trainer and evaluation sit to the right of the methods in the data flow.
        from dataclasses import replace

        from distillery.distill.trainer import Trainer
        from distillery.evaluation import score
        from distillery.runtime import on_device

        cfg = replace(self.config.student, **settings)
        self.student_examples = len(self.task_data.train if train_dataset is None else train_dataset)
        trainer = Trainer(
            student,
            cfg,
            self.task_data.train if train_dataset is None else train_dataset,
            collate_fn or self.task_data.collate,
            loss_fn,
            out_dir=self.out_dir,
            eval_fn=lambda m: score(m, self.task_data, batch_size=cfg.eval_batch_size),
            main_metric=self.task_data.task.main_metric,
            resume=self.resume,
            desc=desc,
        )
        on_device(self.teacher, trainer.device)
        return trainer.train().model

    def distillation_train(self, whole_split: bool):
        """The train split a student distils on, with the teacher's logits (:meth:`train_with_teacher_logits`):
        the run's examples, or with ``whole_split`` every example of the task's train split when the
        budget limited it (``data.train_limit``). The teacher, fine-tuned on the budget's examples,
        labels the rest: distillation data, as the papers' students use (CMOW's whole split, TinyBERT's
        augmented set); a student costs far less per example than the teacher's fine-tuning."""
        task_data = self.task_data
        limit = self.config.data.train_limit
        if whole_split and limit is not None and len(task_data.train) >= limit:  # below it the run has them all
            from dataclasses import replace

            from distillery.data.encode import prepare_task_data

            full = prepare_task_data(task_data.task, self.tokenizer, replace(self.config.data, train_limit=None), splits=("train",))
            if len(full.train) > len(task_data.train):
                task_data = replace(task_data, train=full.train)
                self.notes.append(f"Student data: all {len(full.train)} training examples, labelled by the teacher "
                                  f"(fine-tuned on {len(self.task_data.train)}).")
        return self.train_with_teacher_logits(task_data)

    def train_with_teacher_logits(self, task_data: TaskData | None = None):
        """The train split plus a ``teacher_logits`` column (classification: logits; regression: the
        score), computed once per teacher and data: cached under ``$DISTILLERY_CACHE/logits`` by a
        hash of the teacher's weights (an export's graph or int8 weights: ``runtime.weights_digest``) and the
        encoded train split, so a second student of the same
        task (another method, an ablation, a resumed run) does not pay the teacher's passes again.
        ``task_data``: another encoding of the task to label (default the run's)."""
        import hashlib

        import numpy as np

        from distillery.evaluation import predict
        from distillery.runtime import weights_digest
        from distillery.config import cache_root

        task_data = task_data or self.task_data
        train = task_data.train
        key = hashlib.sha256(f"{weights_digest(self.teacher)} {content_digest(train)}".encode()).hexdigest()[:16]
        path = cache_root() / "logits" / f"{task_data.task.name}-{key}.npy"
        # Under a launcher, each node's first process fills the cache and the others then read it.
        with distributed.local_main_first():
            logits = read_logits_cache(path, len(train))
            if logits is None:
                logits = predict(self.teacher, task_data, batch_size=self.config.student.eval_batch_size, split="train")
                logits = np.asarray(logits, dtype=np.float32).reshape(len(train), -1)
                with writing(path, "the teacher's logits (a cache entry)"):
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with atomic_file(path) as f:  # a killed run leaves no half-written cache entry
                        np.save(f, logits)
        return train.add_column("teacher_logits", logits.tolist())


def read_logits_cache(path: Path, rows: int):
    """The teacher logits cached in ``path`` (float32, ``rows`` rows), or None when there are none or
    the file cannot be trusted (truncated, an object array, another shape): then it is deleted, with
    a warning naming it, to be computed again. Never unpickled."""
    import numpy as np

    if not path.is_file():
        return None
    try:
        logits = np.load(path, allow_pickle=False)
        if logits.dtype != np.float32 or logits.ndim != 2 or logits.shape[0] != rows:
            raise ValueError(f"a {logits.dtype} array of shape {logits.shape}, not {rows} rows of float32")
    except (ValueError, EOFError, OSError) as e:  # numpy's errors on truncated, pickled or garbled files
        logger.warning("The cached teacher logits %s are damaged (%s); they are deleted and computed again.",
                       path, str(e).splitlines()[0] if str(e) else type(e).__name__)
        path.unlink(missing_ok=True)
        return None
    return logits


# -- method options ------------------------------------------------------------------------------
# A spec is a function (name, value) -> value that returns the value in its type or raises a
# sentence naming the option; each field of a method's MethodOptions dataclass carries one.

Spec = Callable[[str, Any], Any]


def number(low: float | None = None, high: float | None = None, *, above: float | None = None,
           below: float | None = None, whole: bool = False, optional: bool = False) -> Spec:
    """A finite number (an int with ``whole``) in [low, high], or (above, below) where given."""

    def check(name: str, value: Any) -> Any:
        if value is None and optional:
            return None
        kind = "a whole number" if whole else "a number"
        ok_type = isinstance(value, int) if whole else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok_type or not math.isfinite(value):
            raise DistilleryError(f"Option {name} must be {kind}{' (or unset)' if optional else ''}, got {value!r}.")
        limits = [(op, bound) for op, bound in ((">=", low), (">", above), ("<=", high), ("<", below)) if bound is not None]
        fits = {">=": lambda b: value >= b, ">": lambda b: value > b, "<=": lambda b: value <= b, "<": lambda b: value < b}
        if not all(fits[op](bound) for op, bound in limits):
            wanted = " and ".join(f"{op} {bound:g}" for op, bound in limits)
            raise DistilleryError(f"Option {name} must be {kind} {wanted}, got {value!r}.")
        return value if whole else float(value)

    return check


def one_of(*choices: Any, optional: bool = False) -> Spec:
    def check(name: str, value: Any) -> Any:
        if value is None and optional:
            return None
        if value not in choices or isinstance(value, bool) != isinstance(choices[0], bool):
            raise DistilleryError(f"Option {name} must be one of {', '.join(map(str, choices))}, got {value!r}.")
        return value

    return check


def flag(optional: bool = False) -> Spec:
    def check(name: str, value: Any) -> Any:
        if (value is None and optional) or isinstance(value, bool):
            return value
        raise DistilleryError(f"Option {name} must be true or false, got {value!r}.")

    return check


def text(optional: bool = False) -> Spec:
    """A string (a path, a name); None where ``optional``."""

    def check(name: str, value: Any) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value:
            raise DistilleryError(f"Option {name} must be a non-empty string, got {value!r}.")
        return value

    return check


def option(default: Any = None, spec: Spec | None = None) -> Any:
    """A field of a method's options: its default and the spec that checks (and types) a value."""
    return field(default=default, metadata={"spec": spec})


@dataclass
class MethodOptions:
    """A method's options as one typed dataclass, every field checked by its spec in __post_init__,
    so a bad value fails with a sentence before the teacher is fine-tuned, not after. Subclasses add
    fields with :func:`option` and cross-field checks in :meth:`check`; ``ALIASES`` maps another
    spelling of an option to its field (moebert's ``lambda``, a Python keyword, is the field ``lam``)."""

    METHOD: ClassVar[str] = ""
    ALIASES: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        for f in fields(self):
            spec = f.metadata.get("spec")
            if spec is not None:
                setattr(self, f.name, spec(self._name(f.name), getattr(self, f.name)))
        self.check()

    def check(self) -> None:
        """Checks that involve several options (none by default)."""

    @classmethod
    def _name(cls, field_name: str) -> str:  # the name a user writes
        return next((alias for alias, name in cls.ALIASES.items() if name == field_name), field_name)

    @classmethod
    def names(cls) -> list[str]:
        return [cls._name(f.name) for f in fields(cls)]

    @classmethod
    def read(cls, given: Mapping[str, Any]):
        """The options from a ``method_options`` mapping (defaults for the rest); unknown keys named."""
        given = {cls.ALIASES.get(k, k): v for k, v in given.items()}
        known = {f.name for f in fields(cls)}
        unknown = sorted(cls._name(k) for k in set(given) - known)
        if unknown:
            renamed = " (the weight of the distillation term is kd_weight, in every method)" \
                if "alpha" in unknown and "kd_weight" in known else ""
            raise DistilleryError(f"Unknown option(s) for method {cls.METHOD}: {', '.join(unknown)}{renamed}; "
                                  f"known: {', '.join(cls.names())}.")
        return cls(**given)

    @classmethod
    def check_value(cls, name: str, value: Any) -> Any:
        """One option's value checked by its field's spec (for commands that take a few of them)."""
        spec = {f.name: f.metadata.get("spec") for f in fields(cls)}.get(cls.ALIASES.get(name, name))
        return spec(name, value) if spec is not None else value


def get_method(name: str) -> ModuleType:
    """The method's module (with ``run`` and maybe ``check``)."""
    if name not in METHODS:
        raise DistilleryError(f"Unknown method {name!r}; choose one of {', '.join(sorted(METHODS))}.")
    return importlib.import_module(METHODS[name])
