"""Configuration as data: one dataclass per stage, validated on construction, saved as YAML.

A run folder's ``config.yaml`` is ``RunConfig.to_dict()``; ``RunConfig.from_dict`` reads it back,
so a run can be repeated or resumed from its own folder.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

from distillery.errors import DistilleryError
from distillery.safe_yaml import load_yaml, yaml_problem

BUDGETS = ("quick", "full")
# What a run is when nothing says otherwise (the teacher's: BUILTIN_TEACHER): written here only, read by the
# dataclasses below, the settings' resolution (pipeline.resolve_settings), the command line and auto.
DEFAULT_METHOD, DEFAULT_TASK, DEFAULT_BUDGET = "distill", "sst2", "quick"
# distillery.export's formats; "int8" is whichever int8 backend was faster where we measured.
EXPORT_FORMATS = ("onnx", "onnx-int8", "torch-int8", "int8")
DEFAULT_DATA_ENV = "DISTILLERY_DATA"


class ConfigError(DistilleryError):
    """A bad value of one setting, named by its dotted path (``student.epochs``)."""

    def __init__(self, name: str, problem: str):
        self.name, self.problem = name, problem
        super().__init__(f"{name} {problem}")

    def under(self, section: str) -> "ConfigError":
        return ConfigError(f"{section}.{self.name}", self.problem)


# A settings file is a few hundred bytes; a larger one is read no further (a device would never end).
MAX_CONFIG_BYTES = 2**20


def parse_value(text: str, name: str = "value") -> Any:
    """A command-line setting's value: YAML (numbers, lists, booleans), plus the exponent floats
    YAML 1.1 leaves as strings (``3e-4``). ``name`` is the setting, for the error message."""
    try:
        # plain data only: the tags !!python/... fail, !!binary gives bytes (refused below)
        value = load_yaml(text)
    except yaml.YAMLError as e:
        raise DistilleryError(f"{name}={text!r} is not a plain YAML value ({yaml_problem(e)}).") from None
    if not _plain(value):
        raise DistilleryError(f"{name}={text!r} is not a plain value (a number, a string, true/false or a list).")
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def _plain(value: Any) -> bool:
    """Whether ``value`` is what a setting may hold: YAML scalars, lists and mappings of them
    (not the bytes, dates and sets that YAML tags produce)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint) if a is not type(None))
    origin = typing.get_origin(hint)
    if origin is not None:
        return {list: "a list", dict: "a mapping"}.get(origin, str(origin))
    return {str: "a string", int: "a whole number", float: "a number", bool: "true or false"}.get(
        hint, getattr(hint, "__name__", str(hint)))


def _coerce(value: Any, hint: Any) -> Any:
    """``value`` as a field of type ``hint``, or TypeError. Numbers may be written as YAML leaves
    some floats (``1e-4`` as a string); an int is a float; a bool is neither."""
    if hint is Any:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg)
            except TypeError:
                pass
        raise TypeError
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise TypeError
        return [_coerce(v, args[0]) if args else v for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise TypeError
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError
        return value
    if hint is float:
        if isinstance(value, bool):
            raise TypeError
        if isinstance(value, int):
            return float(value)
        if isinstance(value, float):
            return value
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise TypeError from None
        raise TypeError
    if hint is str:
        if isinstance(value, os.PathLike):  # a folder or file given as a Path
            return os.fspath(value)
        if not isinstance(value, str):
            raise TypeError
        return value
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, hint):
            raise TypeError
        return value
    return value


def check_fields(obj: Any) -> None:
    """Coerce every field of the dataclass ``obj`` to its annotated type, or name the first that
    does not fit; every number must be finite (a NaN passes every ``<`` check unseen)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        try:
            coerced = _coerce(value, hints[f.name])
        except TypeError:
            raise ConfigError(f.name, f"must be {_type_name(hints[f.name])}, got {value!r}.") from None
        if isinstance(coerced, float) and not math.isfinite(coerced):
            raise ConfigError(f.name, f"must be a finite number, got {coerced}.")
        setattr(obj, f.name, coerced)


# Upper bounds no real run comes near: past them a value is a typo or an attack (a batch of 1e26
# overflows a tensor's size, 1e23 steps never end), refused before anything is loaded.
MAX_SIZE = 2**20  # examples in one batch, tokens in one sequence
# An embedder's poolings (``data.pooling``): sentence-transformers' Pooling modes, by its names, the first the default
# (distillery.kinds.embedding.pooled computes them)
SENTENCE_POOLINGS = ("mean", "cls", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
MAX_COUNT = 10**9  # optimizer steps, examples, evaluations
MAX_EPOCHS = 10**6


def check_ranges(obj: Any, ranges: dict[str, tuple]) -> None:
    """Each field of ``obj`` named in ``ranges`` (name -> (low, high, unit), or (low, high, unit, True) where low
    itself is refused) within its range unless it is None; the first that is not is named with the range it
    refused by, so that the sentence says exactly what is accepted."""
    defaults = {f.name: f.default for f in dataclasses.fields(obj)}
    for name, (low, high, unit, *above) in ranges.items():
        value, open_low = getattr(obj, name), bool(above and above[0])
        if value is None:
            continue
        if not ((low < value) if open_low else (low <= value)) or value > high:
            unset = " (or unset)" if defaults.get(name) is None else ""
            span = f"more than {low:,} and at most {high:,}" if open_low else f"from {low:,} to {high:,}"
            raise ConfigError(name, f"must be {span} {unit}{unset}, got {value}.")


def from_mapping(cls: type, d: Any, section: str | None = None) -> Any:
    """The dataclass ``cls`` from a mapping of its fields (a YAML section), nested dataclasses
    included; an unknown key or a bad value is named by its dotted path."""
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise ConfigError(section or "config", f"must be a mapping of settings, got {d!r}.")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    try:
        for key, value in d.items():
            if key not in names:
                raise ConfigError(str(key), f"is not a setting; known: {', '.join(names)}.")
            hint = hints[key]
            kwargs[key] = from_mapping(hint, value, str(key)) if dataclasses.is_dataclass(hint) else value
        return cls(**kwargs)
    except ConfigError as e:
        raise (e.under(section) if section else e) from None


def cache_root() -> Path:
    """Where fine-tuned teachers, fetched teachers and teacher logits are kept: $DISTILLERY_CACHE, else ~/.cache/distillery."""
    return Path(os.environ.get("DISTILLERY_CACHE") or Path.home() / ".cache" / "distillery")


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path | None:
    """The local data folder: the explicit option, else ``$DISTILLERY_DATA``, else None (the Hub)."""
    value = data_dir if data_dir not in (None, "") else os.environ.get(DEFAULT_DATA_ENV) or None
    return Path(value).expanduser() if value is not None else None


@dataclass
class DataConfig:
    """Which task and data, and how to encode it."""

    task: str = DEFAULT_TASK
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
    # token-labelled custom files in CoNLL's columns: where the word and its tag are (0-based; tag None: the last)
    token_column: int | None = None
    tag_column: int | None = None
    # token classification: label every sub-word of a training word (B-X continuing as I-X), not only the first
    label_all_subwords: bool = False
    # the student's extra text (MethodContext.distillation_train): rows the teacher labels
    unlabeled_file: str | None = None  # one text (or pair) per row, CSV/TSV/JSONL as custom data
    augment_model: str | None = None  # a masked LM (name or folder) for augmentation; else the teacher's own
    # an embedder's pooling (SENTENCE_POOLINGS) and prompts (a name -> the text put before a text; default_prompt:
    # the one every text gets): its teacher's sentence-transformers files decide them, given for a plain encoder
    pooling: str | None = None
    prompts: dict[str, str] | None = None
    default_prompt: str | None = None
    # SQuAD
    squad_holdout: float | None = None  # fraction of dev articles held out as dev; rest trains
    doc_stride: int = 64  # overlap of SQuAD windows (the full budget uses 128 with 384-token windows)
    max_answer_length: int = 30
    n_best: int = 20
    null_score_threshold: float = 0.0

    # (SQuAD encoding also caps doc_stride to what each window leaves for the context.)
    RANGES: ClassVar[dict[str, tuple[float, float, str]]] = {
        "max_length": (8, MAX_SIZE, "tokens"), "train_limit": (1, MAX_COUNT, "examples"),
        "dev_limit": (1, MAX_COUNT, "examples"), "doc_stride": (1, MAX_SIZE, "tokens"),
        "max_answer_length": (1, MAX_SIZE, "tokens"), "n_best": (1, 1000, "candidate answers"),
    }
    # Settings that only task "custom" reads: given with another task they would be ignored, yet
    # recorded in config.yaml as if they had been used.
    CUSTOM_ONLY: ClassVar[tuple[str, ...]] = ("train_file", "dev_file", "text_column", "text_pair_column",
                                              "label_column", "regression", "token_column", "tag_column")

    def __post_init__(self) -> None:
        check_fields(self)
        check_ranges(self, self.RANGES)
        if self.squad_holdout is not None and not 0.0 < self.squad_holdout < 1.0:
            raise ConfigError("squad_holdout", f"(--squad-holdout) is the fraction of dev articles kept for "
                              f"evaluation and must be between 0 and 1, got {self.squad_holdout}.")
        check_seed(self.seed)
        if self.pooling not in (None, *SENTENCE_POOLINGS):
            raise ConfigError("pooling", f"is how an embedder's sentence vector is read from its last hidden states: "
                              f"one of {', '.join(SENTENCE_POOLINGS)}, got {self.pooling!r}.")
        given = next((n for n in ("pooling", "prompts", "default_prompt") if getattr(self, n) is not None), None)
        if given and str(self.task).lower() != "embedding":
            raise ConfigError(given, f"is an embedder's (--task embedding); task {self.task} would ignore it.")
        if not all(isinstance(v, str) for v in (self.prompts or {}).values()):
            raise ConfigError("prompts", f"maps a prompt's name to its text, got {self.prompts!r}.")
        if self.default_prompt not in (None, *(self.prompts or {})):
            names = ", ".join(self.prompts or {}) or "none given"
            raise ConfigError("default_prompt", f"names one of data.prompts ({names}), got {self.default_prompt!r}.")
        if str(self.task).lower() != "custom":
            given = next((name for name in self.CUSTOM_ONLY if getattr(self, name) not in (None, False)), None)
            if given is not None:
                option = "--" + given.replace("_", "-")
                raise ConfigError(given, f"({option}) is only for task custom (your own files); task {self.task} "
                                  f"reads its own data and would ignore it.")

    @property
    def resolved_data_dir(self) -> Path | None:
        return resolve_data_dir(self.data_dir)


def check_seed(seed: int) -> None:
    # numpy and torch take seeds in [0, 2**32); a negative one fails deep inside set_seed
    if not 0 <= seed < 2**32:
        raise ConfigError("seed", f"must be a whole number from 0 to 2**32 - 1, got {seed}.")


@dataclass
class TrainConfig:
    """Settings of the one training loop (``distillery.training.trainer``)."""

    epochs: float = 1.0
    # passes when a student learns from the whole train split past the budget's limit (train_examples=all);
    # unset: epochs. One pass over SST-2's 67k is more examples than two over the budget's 20k, in half the time
    whole_split_epochs: float | None = None
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

    RANGES: ClassVar[dict[str, tuple[float, float, str]]] = {
        "epochs": (0, MAX_EPOCHS, "passes over the train split"), "max_steps": (1, MAX_COUNT, "optimizer steps"),
        "whole_split_epochs": (0, MAX_EPOCHS, "passes over the whole train split"),
        "batch_size": (1, MAX_SIZE, "examples"), "grad_accum": (1, MAX_SIZE, "batches"),
        "eval_every": (1, MAX_COUNT, "optimizer steps"), "eval_batch_size": (1, MAX_SIZE, "examples"),
        "patience": (1, MAX_COUNT, "evaluations"), "log_every": (0, MAX_COUNT, "optimizer steps (0: no log lines)"),
    }

    def __post_init__(self) -> None:
        check_fields(self)
        ranges = dict(self.RANGES)
        if not self.max_steps:  # only a run bounded by max_steps may make no pass
            ranges["epochs"] = (0, MAX_EPOCHS, "passes over the train split (or 0 with max_steps)", True)
        check_ranges(self, ranges)
        if self.lr <= 0:
            raise ConfigError("lr", f"(the learning rate) must be positive, got {self.lr}.")
        if self.weight_decay < 0:
            raise ConfigError("weight_decay", f"must be zero or more, got {self.weight_decay}.")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ConfigError("max_grad_norm", f"must be positive (or unset), got {self.max_grad_norm}.")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError("warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}.")
        check_seed(self.seed)


# The built-in teachers' names (distillery.teacher resolves them); here, below every module that names them.
BUILTIN_TEACHER = "minilm"
BASE_TEACHER = "mpnet-base"  # all-mpnet-base-v2, fetched once into the cache (distillery.mpnet_download)
# where the built-in teachers come from on the Hub (a model card's base_model)
TEACHER_HUB_IDS = {BUILTIN_TEACHER: "sentence-transformers/all-MiniLM-L6-v2",
                   BASE_TEACHER: "sentence-transformers/all-mpnet-base-v2"}


@dataclass
class TeacherConfig:
    """Which teacher, and how to fine-tune it when it is not fine-tuned for the task yet."""

    name: str = BUILTIN_TEACHER  # "minilm" (packaged all-MiniLM-L6-v2), a local folder, or a Hub id
    finetuned: bool = False  # the given teacher already has the task head: use it as it is
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class RunConfig:
    """Everything ``distillery compress`` needs; written to the run folder as config.yaml."""

    method: str = DEFAULT_METHOD
    budget: str = DEFAULT_BUDGET
    out: str | None = None
    data: DataConfig = field(default_factory=DataConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    student: TrainConfig = field(default_factory=TrainConfig)
    method_options: dict[str, Any] = field(default_factory=dict)
    bench: dict[str, Any] = field(default_factory=dict)  # overrides of distillery.bench defaults
    export: list[str] = field(default_factory=list)  # deployment variants measured beside teacher and student
    # the free baselines measured beside them: the teacher's int8 copy and a static-embedding model (live_baselines.py)
    baselines: bool = True
    # the student's int8 export (the faster int8 backend) scored and measured beside it, kept in exports/: it
    # often runs twice as fast for under a point, and the verdict weighs it against the free baselines
    int8: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.export, str):
            self.export = [self.export]
        if self.export is None:
            self.export = []
        check_fields(self)
        if self.budget not in BUDGETS:
            raise DistilleryError(f"Unknown budget {self.budget!r}; choose one of {', '.join(BUDGETS)}.")
        unknown = [f for f in self.export or [] if f not in EXPORT_FORMATS]
        if unknown:
            raise DistilleryError(f"Unknown export format {unknown[0]!r}; choose one of {', '.join(EXPORT_FORMATS)}.")
        self.export = list(self.export or [])

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunConfig":
        return from_mapping(cls, d)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(self.to_yaml())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RunConfig":
        try:
            return cls.from_dict(read_yaml_mapping(path))
        except DistilleryError as e:
            raise DistilleryError(f"{path}: {e}") from None


def read_yaml_mapping(path: str | os.PathLike) -> dict[str, Any]:
    """The mapping a YAML settings file holds; a sentence naming the file if it is missing or not one
    (a device such as /dev/zero, which would be read forever, or a file too large for settings)."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():
        raise DistilleryError(f"Config file {path} is not a regular file (a device, pipe or socket); give a YAML file.")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise DistilleryError(f"Config file {path} is larger than {MAX_CONFIG_BYTES // 2**20} MiB; a settings "
                                  f"file holds a few dozen lines.")
        raw = load_yaml(data.decode("utf-8"))
    except (FileNotFoundError, IsADirectoryError):
        raise DistilleryError(f"No config file at {path}.") from None
    except yaml.YAMLError as e:
        raise DistilleryError(f"{path} is not valid YAML: {yaml_problem(e)}.") from None
    except UnicodeDecodeError as e:
        raise DistilleryError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise DistilleryError(f"{path} must hold a mapping of settings.")
    return raw


def dotted_settings(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"student": {"lr": 1e-4}}`` -> ``{"student.lr": 1e-4}``: a settings file as command-line overrides."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(dotted_settings(value, name + "."))
        else:
            out[name] = value
    return out


def nested_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``{"student.lr": 1e-4}`` -> ``{"student": {"lr": 1e-4}}``: dotted settings (budgets, presets,
    flags) in RunConfig's shape, later keys over earlier ones."""
    tree: dict[str, Any] = {}
    for dotted, value in settings.items():
        node = tree
        *parents, leaf = dotted.split(".")
        for depth, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):  # a settings file's `student: 3` beside a --lr flag
                section = ".".join(parents[: depth + 1])
                raise ConfigError(section, f"must be a mapping of settings, got {node!r} (setting {dotted}).")
        node[leaf] = value
    return tree


def setting(tree: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    """``tree["a"]["b"]`` for ``"a.b"``, or ``default`` where a part is missing (a config.yaml read as
    data, a results file)."""
    value: Any = tree
    for key in dotted.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return default
        value = value[key]
    return value


def check_resumed_settings(out: str | os.PathLike, saved: Mapping[str, Any], given: Mapping[str, Any],
                           remedy: str) -> None:
    """``--resume`` continues the run in ``out`` with its saved settings (``saved``: a settings tree, or dotted
    keys): refuse in one sentence each setting of ``given`` (dotted key -> value) given with another value, naming
    both, rather than ignore it or let it change the run half-way. ``remedy`` ends the sentence. Every --resume
    (a run's, auto's, a step command's) checks here."""
    was = lambda key: saved[key] if key in saved else setting(saved, key)  # noqa: E731
    differing = [f"{key} (saved {was(key)!r}, given {value!r})" for key, value in given.items() if was(key) != value]
    if differing:
        raise DistilleryError(f"--resume continues the run in {out} with its saved settings, but these were given "
                              f"differently: {'; '.join(differing)}. {remedy}")


def run_inputs(config: RunConfig) -> list[str]:
    """The local paths a run reads (teacher, data folder, data files, method inputs such as an init
    model): its output folder may be none of them, nor hold one."""
    paths = [config.teacher.name, resolve_data_dir(config.data.data_dir), config.data.train_file, config.data.dev_file,
             config.data.unlabeled_file, config.data.augment_model]
    paths += [v for v in config.method_options.values() if isinstance(v, str) and ("/" in v or os.sep in v)]
    return [str(p) for p in paths if p]


# --time-budget (compress --method auto): a duration in words

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([hms]?)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "": 1.0}


def parse_time_budget(text: str | float | int | None) -> float | None:
    """Seconds from ``--time-budget``: "2h", "30m", "1h30m", "90s" or a number of seconds; None: no budget."""
    if text is None:
        return None
    raw = str(text).strip().lower().replace(" ", "")
    parts = _DURATION.findall(raw)
    bare = len(parts) > 1 and any(unit == "" for _, unit in parts)  # "1h30" is ambiguous
    if not raw or "".join(n + u for n, u in parts) != raw or bare:
        raise DistilleryError(f"--time-budget must be a duration such as 30m, 2h, 1h30m, 90s or a number of "
                              f"seconds, got {text!r}.")
    seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    if seconds <= 0:
        raise DistilleryError(f"--time-budget must be longer than 0 seconds, got {text!r}.")
    return seconds
