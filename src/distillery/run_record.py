"""The run folder's record, in one home: metrics.json, bench.json and train.json as typed records, written
and read back here and nowhere else (docs/architecture.md, the run folder contract).

- :class:`Metrics` (metrics.json): dev scores of teacher, student, exports (``others``) and live baselines,
  retention, chance, the chain of teachers; every key is declared in :data:`METRICS_FIELDS`, and a field
  declared there with a ``title`` is shown, with no other edit, in the report, the model card and a merged
  report (:meth:`Metrics.facts`).
- :class:`Bench` (bench.json): what :func:`distillery.bench.benchmark` measured, read back.
- :class:`Train` (train.json): times, example counts, the student's text and the method's notes.
- :class:`Run`: a run folder loaded (:func:`load_run`), and its rows, one per model (:func:`run_rows`).

A file damaged or edited by hand is refused with one sentence naming the file and the field
(:func:`check_shape`). Nothing here imports torch: the report, the model card and auto read runs with it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import yaml

from distillery.config import setting
from distillery.safe_yaml import load_yaml, yaml_problem
from distillery.errors import DistilleryError
from distillery.folders import atomic_file, writing
from distillery.metrics import is_finite_number, score_range

CONFIG, METRICS, BENCH, TRAIN = "config.yaml", "metrics.json", "bench.json", "train.json"
REQUIRED_FILES = (CONFIG, METRICS, BENCH)
OPTIONAL_FILES = (TRAIN,)
# The free baselines' model names in metrics.json ``baselines`` and bench.json ``models``
# (distillery.live_baselines builds them).
INT8_NAME = "teacher-int8"
STATIC_NAME = "static-embeddings"
BASELINE_NAMES = (INT8_NAME, STATIC_NAME)

# --------------------------------------------------------------------------------------------
# The fields and their types

NUMBER = "a number"
SCORES = {"": dict, "*": NUMBER}
GROUP = {"": dict, "*": dict, "*.*": NUMBER}


@dataclass(frozen=True)
class Field:
    """A top-level key of a run file: ``shape``, its type (a type, :data:`NUMBER`, or ``{sub-path: type}``
    for a nested value, "*" for every key or item; None: not checked); ``title``: where given, the value is
    shown as "title: value" in the report, the model card and a merged report."""

    key: str
    shape: Any
    title: str | None = None


METRICS_FIELDS: list[Field] = [
    Field("task", str), Field("split", str), Field("main_metric", str),
    Field("teacher", SCORES), Field("student", SCORES), Field("retention", NUMBER), Field("chance", None),
    Field("other_splits", {"": dict, "*": dict, "*.*": dict, "*.*.*": NUMBER}),
    Field("others", GROUP), Field("baselines", GROUP), Field("baseline_notes", {"": list, "*": str}),
    Field("dev_limit", None), Field("chain", list), Field("dev_examples", NUMBER),
    Field("tie_metrics", {"": dict, "*": NUMBER}),
]
TRAIN_SHAPE = {
    **{k: NUMBER for k in ("teacher_seconds", "student_seconds", "total_seconds", "train_examples",
                           "teacher_train_examples")},
    "teacher_cached": bool, "teacher_path": str, "notes": list, "notes.*": str,
    "student_text": dict, "student_text.augment_source": str,
    **{f"student_text.{k}": NUMBER for k in ("labelled", "augmented", "unlabeled", "labelling_seconds")},
}
BENCH_SHAPE = {
    "hardware": dict, "models": dict, "models.*": dict,
    **{f"models.*.{k}": NUMBER for k in ("params", "effective_params", "flops_per_token")},
    "models.*.latency_ms": dict, "models.*.latency_ms.median": NUMBER, "models.*.latency_ms.p90": NUMBER,
    "models.*.throughput": dict, "models.*.throughput.sentences_per_s": NUMBER,
    "speedup": dict, "speedup.latency": NUMBER, "speedup.throughput": NUMBER,
    "speedups": dict, "speedups.*": dict, "settings": dict, "sweep": list, "sweep.*": dict,
}


def metrics_shape() -> dict[str, Any]:
    """metrics.json's shape for :func:`check_shape`, from :data:`METRICS_FIELDS` (read when called)."""
    out: dict[str, Any] = {}
    for f in METRICS_FIELDS:
        if f.shape is None:
            continue
        for sub, kind in (f.shape.items() if isinstance(f.shape, dict) else [("", f.shape)]):
            out[f.key + ("." + sub if sub else "")] = kind
    return out


_TYPE_WORDS = {dict: "a mapping", list: "a list", str: "a string", bool: "true or false", NUMBER: NUMBER}


def _kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return f"{str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    return {dict: "a mapping", list: "a list"}.get(type(value), type(value).__name__)


def _found(node: Any, pattern: list[str], where: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of each value of ``node`` at ``pattern`` (a key per level, "*" for every key or
    item); none where a level is missing or of another type (its own entry in a shape checks that)."""
    if not pattern:
        yield ".".join(where), node
        return
    head, rest = pattern[0], pattern[1:]
    if isinstance(node, dict):
        items = node.items() if head == "*" else ([(head, node[head])] if head in node else [])
    elif isinstance(node, list) and head == "*":
        items = enumerate(node)
    else:
        return
    for key, child in items:
        yield from _found(child, rest, (*where, str(key)))


def check_shape(path: Path, value: Any, shape: Mapping[str, Any]) -> None:
    """Refuse ``value`` (the JSON of ``path``) when a field named in ``shape`` holds another type. None
    (JSON null) passes where a field may be missing; NaN is a number here."""
    if not isinstance(value, dict):
        raise DistilleryError(f"{path} must hold a JSON object, not {_kind_of(value)}.")
    for name, expected in shape.items():
        for where, node in _found(value, name.split(".")) if name else ():
            ok = (node is None or (isinstance(node, (int, float)) and not isinstance(node, bool)) if expected is NUMBER
                  else node is None or isinstance(node, expected))
            if not ok:
                raise DistilleryError(f"{path}: {where} holds {_kind_of(node)}, where a report reads "
                                      f"{_TYPE_WORDS[expected]}; the file was damaged or edited by hand.")


# --------------------------------------------------------------------------------------------
# metrics.json


@dataclass
class ChanceLevel:
    """metrics.json ``chance``: the score of a model that learned nothing, and the margin its dev set allows."""

    main: float
    margin: float
    predictor: str | None = None


def chain_link(model: Any, method: Any, task: Any, metrics: Any) -> dict[str, Any]:
    """One entry of metrics.json ``chain``: a model, what made it from the one before (None for the original
    teacher), its task and its scores."""
    return {"model": model, "method": method, "task": task, "metrics": metrics}


@dataclass
class Metrics:
    """metrics.json. The attributes are the keys the code computes with (each one declared in
    :data:`METRICS_FIELDS`); any other key read or set is kept in ``extra``, in order."""

    task: str | None = None
    split: str | None = None
    main_metric: str | None = None
    teacher: dict[str, Any] = field(default_factory=dict)
    student: dict[str, Any] | None = None
    retention: float | None = None
    chance: dict[str, Any] | None = None
    other_splits: dict[str, Any] | None = None
    others: dict[str, dict[str, Any]] | None = None
    baselines: dict[str, dict[str, Any]] | None = None
    baseline_notes: list[str] | None = None
    dev_limit: int | None = None
    chain: list[dict[str, Any]] | None = None
    dev_examples: int | None = None  # the examples the dev scores average over (their sampling noise)
    tie_metrics: dict[str, int] | None = None  # other metrics auto's ties read, with their examples (TaskKind.tie_metrics)
    extra: dict[str, Any] = field(default_factory=dict)

    WRITTEN_WHEN_NONE = ("retention",)  # null in the file: the teacher scored 0, no retention

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Metrics:
        own = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in data.items() if k in own},
                   extra={k: v for k, v in data.items() if k not in own})

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return {**{k: v for k, v in out.items() if v is not None or k in self.WRITTEN_WHEN_NONE}, **self.extra}

    def value(self, key: str) -> Any:
        """A field by its key, declared as an attribute or not."""
        return getattr(self, key) if key in self.__dataclass_fields__ and key != "extra" else self.extra.get(key)

    def facts(self) -> list[tuple[str, Any]]:
        """``(title, value)`` of every field of :data:`METRICS_FIELDS` with a title and a value."""
        return [(f.title, self.value(f.key)) for f in METRICS_FIELDS if f.title and self.value(f.key) is not None]

    def main(self) -> str:
        """The main metric: the recorded one, else the teacher's first numeric score."""
        if self.main_metric:
            return str(self.main_metric)
        numeric = [k for k, v in (self.teacher or {}).items() if is_finite_number(v)]
        return numeric[0] if numeric else "score"

    def scores(self) -> dict[str, dict[str, float]]:
        """Every model's finite numeric scores: teacher, student, the exports ("others"), then the live baselines."""
        out: dict[str, dict[str, float]] = {}
        sources = [("teacher", self.teacher), ("student", self.student)]
        sources += list((self.others or {}).items()) + list((self.baselines or {}).items())
        for name, values in sources:
            if isinstance(values, Mapping):
                out[str(name)] = {k: float(v) for k, v in values.items() if is_finite_number(v)}
        return out

    def recorded(self, name: str) -> Mapping[str, Any] | None:
        """A model's scores as recorded (not filtered: a score that is not a number stays, to be refused)."""
        groups = {**(self.others or {}), **(self.baselines or {}), "teacher": self.teacher, "student": self.student}
        return groups.get(name)

    def chance_level(self) -> ChanceLevel | None:
        chance = self.chance
        if not isinstance(chance, Mapping) or not all(is_finite_number(chance.get(k)) for k in ("main", "margin")):
            return None
        return ChanceLevel(float(chance["main"]), float(chance["margin"]), chance.get("predictor"))

    def chance_warning(self) -> str | None:
        """One sentence, plain text, when the teacher's dev score is within noise of a model that learned
        nothing (``chance``, :func:`distillery.evaluation.chance_score`), else None."""
        chance, main = self.chance_level(), self.main_metric
        teacher = (self.teacher or {}).get(main)
        if chance is None or not is_finite_number(teacher) or teacher > chance.main + chance.margin:
            return None
        return (f"The teacher scores at chance on this dev set: {main} {teacher:.3f} against "
                f"{chance.main:.3f} for {chance.predictor or 'a constant'}, within the "
                f"±{chance.margin:.3f} its size allows. The student's retention against it means nothing; "
                "fine-tune the teacher longer or check the data.")

    def chain_links(self) -> list[dict[str, Any]] | None:
        """The chain of teachers (:func:`chain_link` entries), original teacher first; None without one."""
        chain = self.chain
        if not isinstance(chain, list) or not all(isinstance(link, Mapping) for link in chain):
            return None
        return [chain_link(link.get("model"), link.get("method"), link.get("task"), link.get("metrics"))
                for link in chain]

    def with_student(self, scores: Mapping[str, Any]) -> Metrics:
        """This record with ``scores`` in the student's place."""
        return dataclasses.replace(self, student=dict(scores))


# --------------------------------------------------------------------------------------------
# train.json


@dataclass
class Train:
    """train.json, every field written (null where unknown), in this order."""

    teacher_seconds: float | None = None
    teacher_cached: bool | None = None
    teacher_path: str | None = None
    student_seconds: float | None = None
    train_examples: int | None = None  # the student's: augmented and unlabeled rows may exceed the budget's
    teacher_train_examples: int | None = None
    student_text: dict[str, Any] | None = None  # labelled, augmented, unlabeled rows, augment_source, labelling_seconds
    total_seconds: float | None = None
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Train:
        own = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        values = {k: v for k, v in data.items() if k in own}
        if isinstance(values.get("notes"), str):
            values["notes"] = [values["notes"]]
        values["notes"] = list(values.get("notes") or [])
        return cls(**values, extra={k: v for k, v in data.items() if k not in own})

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}, **self.extra}

    def times(self) -> list[tuple[str, float]]:
        """``(what, seconds)`` of every ``<what>_seconds`` field, in the file's order."""
        return [(key[: -len("_seconds")], float(v)) for key, v in self.to_dict().items()
                if key.endswith("_seconds") and is_finite_number(v)]

    def student_text_counts(self) -> tuple[list[tuple[str, int]], str | None, float | None] | None:
        """The student's text when it held new rows: ``([(kind, rows)], augmentation source, labelling
        seconds)``; None for a run without augmented or unlabeled rows."""
        text = self.student_text
        if not isinstance(text, Mapping) or not any(is_finite_number(text.get(k)) and text[k]
                                                    for k in ("augmented", "unlabeled")):
            return None
        counts = [(k, int(text[k])) for k in ("labelled", "augmented", "unlabeled") if is_finite_number(text.get(k))]
        seconds = text.get("labelling_seconds")
        return counts, text.get("augment_source"), float(seconds) if is_finite_number(seconds) else None


# --------------------------------------------------------------------------------------------
# bench.json (written by distillery.bench.benchmark; read here)


def speedup_over(ref: Mapping[str, Any], rec: Mapping[str, Any]) -> dict[str, float]:
    """How many times faster ``rec`` is than ``ref`` (two models of a bench record): latency ref/rec,
    throughput rec/ref; and the FLOP-ideal ratios for the same shapes (ref FLOPs / rec FLOPs: what a
    speed-up would be if time followed FLOPs)."""
    out = {
        "latency": ref["latency_ms"]["median"] / rec["latency_ms"]["median"],
        "throughput": rec["throughput"]["sentences_per_s"] / ref["throughput"]["sentences_per_s"],
    }
    for key, name in (("flop_ideal_latency", "flops_per_token"), ("flop_ideal_throughput", "flops_per_token_throughput")):
        a, b = ref.get(name), rec.get(name)
        if a and b:
            out[key] = a / b
    return out


def format_hardware(hardware: Mapping[str, Any]) -> str:
    """One line: the GPU timed (when one was), CPU, cores, threads, torch, platform."""
    gpu = hardware.get("gpu")
    # "no GPU" would be wrong for a CPU setting timed on a machine that has one: a fingerprint names
    # the GPU only when the GPU was what was timed.
    parts = [f"GPU {gpu}"] if gpu else []
    parts += [
        f"CPU {hardware.get('cpu', 'unknown')}",
        f"{hardware.get('cores', '?')} cores",
        f"{hardware.get('threads', '?')} torch threads",
        f"torch {hardware.get('torch', '?')}",
    ]
    if hardware.get("platform"):
        parts.append(str(hardware["platform"]))
    return ", ".join(parts)


def setting_label(record: Mapping[str, Any]) -> str:
    """A bench record's setting in words: "CPU, 4 threads", "CUDA fp16 (NVIDIA H100 80GB HBM3)"."""
    settings, hardware = record.get("settings") or {}, record.get("hardware") or {}
    device = settings.get("device") or hardware.get("device") or "cpu"
    if str(device).startswith("cuda"):
        gpu = hardware.get("gpu")
        return f"CUDA {settings.get('dtype', 'fp32')}" + (f" ({gpu})" if gpu else "")
    threads = settings.get("threads", hardware.get("threads"))
    return "CPU" + (f", {threads} thread{'s' if threads != 1 else ''}" if threads else "")


def sweep_of(bench: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every setting's record of a bench record: its ``sweep``, or the record itself (one written before sweeps)."""
    sweep = bench.get("sweep")
    return [r for r in sweep if isinstance(r, Mapping)] if isinstance(sweep, list) and sweep else [bench]


def noise_warning(bench: Mapping[str, Any]) -> str | None:
    """One sentence when a bench record's timings were flagged unstable (``noise``, distillery.bench.noise),
    else None (also for records that predate the check)."""
    noise = bench.get("noise")
    if not isinstance(noise, Mapping) or noise.get("stable", True):
        return None
    reasons = [str(r) for r in noise.get("reasons") or []]
    return ("Unstable timings: " + "; ".join(reasons) + ". The speed-ups may be off: measure again on an idle machine "
            "with distillery bench.")


class Bench:
    """bench.json (or one setting's record of its ``sweep``), read through its accessors."""

    def __init__(self, data: Mapping[str, Any] | None = None):
        self.data = dict(data or {})

    def to_dict(self) -> dict[str, Any]:
        return self.data

    @property
    def models(self) -> dict[str, Mapping[str, Any]]:
        return dict(self.data.get("models") or {})

    @property
    def skipped(self) -> dict[str, Any]:
        """The models a setting could not time, and why."""
        return dict(self.data.get("skipped") or {})

    @property
    def hardware(self) -> dict[str, Any]:
        return dict(self.data.get("hardware") or {})

    def hardware_line(self) -> str | None:
        return format_hardware(self.hardware) if self.hardware else None

    def label(self) -> str:
        return setting_label(self.data)

    def sweep(self) -> list[Bench]:
        return [Bench(r) for r in sweep_of(self.data)]

    def latency_ms(self, name: str) -> float | None:
        return setting(self.models.get(name) or {}, "latency_ms.median")

    def speedup(self, name: str, ref: str = "teacher") -> dict[str, float]:
        """``name``'s speed-ups over ``ref`` (:func:`speedup_over`); empty when either was not timed."""
        models = self.models
        return speedup_over(models[ref], models[name]) if ref in models and name in models else {}

    def student_latency_speedup(self) -> float | None:
        return setting(self.data, "speedup.latency")

    def noise_warning(self) -> str | None:
        return noise_warning(self.data)

    def noise_spread(self, name: str) -> float | None:
        """The spread of ``name``'s timed passes (``noise.spread``), None where it was not judged."""
        value = setting(self.data, "noise.spread", {}) or {}
        value = value.get(name) if isinstance(value, Mapping) else None
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def with_model_as(self, name: str, model: str) -> Bench:
        """This record with ``model``'s timing in ``name``'s place."""
        return Bench({**self.data, "models": {**self.models, name: self.models.get(model)}})


# --------------------------------------------------------------------------------------------
# The run folder

RECORDS = {METRICS: Metrics, BENCH: Bench, TRAIN: Train}


@dataclass
class Run:
    """A run folder's files: its settings (config.yaml, as a mapping) and its three records."""

    dir: Path
    config: dict[str, Any]
    metrics: Metrics
    bench: Bench
    train: Train = field(default_factory=Train)

    def task(self) -> str:
        return str(self.metrics.task or setting(self.config, "data.task") or setting(self.config, "task") or "?")

    def with_student_as(self, model: str) -> Run:
        """The run with ``model`` (an export or a baseline) in the student's place: its scores and timing."""
        scores = (self.metrics.recorded(model) if model != "student" else self.metrics.student) or {}
        return dataclasses.replace(self, metrics=self.metrics.with_student(scores),
                                   bench=self.bench.with_model_as("student", model))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DistilleryError(f"{path} is not valid JSON: {e}") from None


def read_metrics(folder: str | os.PathLike) -> Metrics:
    """A run folder's metrics.json, checked."""
    path = Path(folder) / METRICS
    data = _read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("teacher"), dict):
        raise DistilleryError(f"{path} must hold the teacher's metrics under \"teacher\".")
    check_shape(path, data, metrics_shape())
    check_score_ranges(path, data)
    return Metrics.from_dict(data)


# Where metrics.json holds a mapping of scores (metric -> value) of one model
SCORE_GROUPS = ("teacher", "student", "others.*", "baselines.*", "other_splits.*.*", "chain.*.metrics")


def check_score_ranges(path: Path, data: Mapping[str, Any]) -> None:
    """Refuse a score outside the range of its metric (:func:`metrics.score_range`): an accuracy of 5.0 would
    otherwise be reported, and a student deployed, on it. A run scored with exact_match is a QA run, whose F1
    too is a percentage (the task's name is not asked: a custom QA task is one); the ``chance`` level is in the
    main metric's units. NaN and inf are refused: the metrics never give them (a constant prediction correlates
    0.0), and a NaN passes every comparison unseen."""
    groups = [(where, group) for pattern in SCORE_GROUPS for where, group in _found(data, pattern.split("."))
              if isinstance(group, dict)]
    squad = any("exact_match" in group for _, group in groups)
    scores = [(f"{where}.{name}", name, value, squad) for where, group in groups for name, value in group.items()]
    if isinstance(data.get("chance"), dict):
        scores.append(("chance.main", data.get("main_metric"), data["chance"].get("main"), squad))
    for key, name, value, percent in scores:
        if isinstance(value, float) and not math.isfinite(value):
            raise DistilleryError(f"{path}: {key} holds {value}, but a score is a finite number (metrics never give "
                                  "NaN or inf); the file was damaged or edited by hand.")
        bounds = score_range(str(name), percent)
        if bounds and is_finite_number(value) and not bounds[0] - 1e-9 <= value <= bounds[1] + 1e-9:
            raise DistilleryError(f"{path}: {key} holds {value}, but {name} lies in [{bounds[0]:g}, {bounds[1]:g}]; "
                                  "the file was damaged or edited by hand.")


def read_bench(folder: str | os.PathLike) -> Bench:
    """A run folder's bench.json, checked."""
    path = Path(folder) / BENCH
    data = _read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict) or not data["models"]:
        raise DistilleryError(f"{path} must hold the measured models under \"models\".")
    check_shape(path, data, BENCH_SHAPE)
    return Bench(data)


def read_train(folder: str | os.PathLike) -> Train:
    """A run folder's train.json, checked; an empty record where the run has none."""
    path = Path(folder) / TRAIN
    data = _read_json(path) if path.is_file() else {}
    check_shape(path, data or {}, TRAIN_SHAPE)
    return Train.from_dict(data or {})


def load_run(run_dir: str | os.PathLike) -> Run:
    """A run folder's settings and records, each file checked (one sentence for a missing or bad one)."""
    folder = Path(run_dir).expanduser()
    if not folder.is_dir():
        raise DistilleryError(f"Run folder {run_dir} does not exist.")
    for name in REQUIRED_FILES:
        if not (folder / name).is_file():
            raise DistilleryError(f"Run folder {folder} has no {name}; a report needs {', '.join(REQUIRED_FILES)}.")
    try:
        config = load_yaml((folder / CONFIG).read_text()) or {}
    except yaml.YAMLError as e:
        raise DistilleryError(f"{folder / CONFIG} is not valid YAML: {yaml_problem(e)}.") from None
    if not isinstance(config, dict):
        raise DistilleryError(f"{folder / CONFIG} must hold a mapping of settings.")
    metrics, bench = read_metrics(folder), read_bench(folder)
    return Run(dir=folder, config=config, metrics=metrics, bench=bench, train=read_train(folder))


def save(folder: str | os.PathLike, record: Metrics | Bench | Train) -> Path:
    """Write a record into its file of the run folder, whole or not at all (a full disk is a sentence;
    --resume writes it again)."""
    name = next(file for file, kind in RECORDS.items() if isinstance(record, kind))
    path = Path(folder) / name
    with writing(path, "the run's results"), atomic_file(path, "w") as f:
        f.write(json.dumps(record.to_dict(), indent=2))
    return path


# --------------------------------------------------------------------------------------------
# Names and rows


def teacher_name(config: Mapping[str, Any]) -> str:
    teacher = config.get("teacher")
    if isinstance(teacher, Mapping):
        return str(teacher.get("name") or "teacher")
    return str(teacher) if teacher else "teacher"


def student_name(config: Mapping[str, Any]) -> str | None:
    """The pretrained encoder a run distilled into (method distill's ``--student``), as given; None when the
    student was made from the teacher itself."""
    student = setting(config, "method_options.student")
    return str(student) if student else None


def is_student(name: str) -> bool:
    """The student or one of its exports (``student-onnx-int8``, ...): what a user could deploy."""
    return name == "student" or name.startswith("student-")


def run_rows(run: Run) -> list[dict[str, Any]]:
    """One row per model of a run (measured, scored or both), teacher first.

    Speed-ups are against the run's own teacher (measured in the same process); retention is the
    model's main metric over the teacher's.
    """
    metrics = run.metrics
    main = metrics.main()
    scores = metrics.scores()
    measured = run.bench.models
    names = list(dict.fromkeys(["teacher"] + list(scores) + list(measured)))
    names = [n for n in names if n in scores or n in measured]
    teacher_main = scores.get("teacher", {}).get(main)
    rows = []
    for name in names:
        rec = measured.get(name) or {}
        values = scores.get(name, {})
        latency = setting(rec, "latency_ms.median")
        throughput = setting(rec, "throughput.sentences_per_s")
        speedup = run.bench.speedup(name) if latency and throughput else {}
        score = values.get(main)
        retention = None
        if name == "student" and is_finite_number(metrics.retention):
            retention = float(metrics.retention)
        elif score is not None and teacher_main:
            retention = score / teacher_main
        rows.append({
            "model": name, "params": rec.get("params"), "effective_params": rec.get("effective_params"),
            "flops_per_token": rec.get("flops_per_token"),
            "latency_ms": latency, "latency_shape": (setting(rec, "latency_ms.batch"), setting(rec, "latency_ms.seq")),
            "throughput": throughput,
            "throughput_shape": (setting(rec, "throughput.batch"), setting(rec, "throughput.seq")),
            "latency_speedup": speedup.get("latency"), "throughput_speedup": speedup.get("throughput"),
            "flop_ideal_latency": speedup.get("flop_ideal_latency"),
            "flop_ideal_throughput": speedup.get("flop_ideal_throughput"),
            "metrics": values, "main": score, "retention": retention,
        })
    return rows
