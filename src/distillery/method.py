"""The method contract: a :class:`Method` object per compression method, its options as specs, and the registry.

Every method is a package, registered here by one line (:data:`METHODS`). Its *spec* (``<package>.options``: a
:class:`MethodOptions` dataclass whose fields carry their type, default, range, help and the paper's name, and
``<package>/presets.yaml``: its budget overrides and presets, in dotted keys) is plain data, light to import: the
command line builds its flags, the step commands' flags, ``--option`` checks and the docs' option tables from it.
Its *recipe* (a :class:`Method` subclass, ``<package>.recipe``) holds the typed hooks the pipeline calls:
:meth:`Method.check` before the teacher is fine-tuned, :meth:`Method.run` to build and train the student. A
package may add ``steps.py`` (``app``: its step commands, ``distillery <method> <step>``) and ``auto.py`` (what
``--method auto`` needs to know of it: ``reach`` and ``candidates``, each given an :class:`AutoAsk`). This module
imports neither torch nor transformers, and a method package's ``__init__`` imports nothing, so that the command
line starts at once.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from distillery.safe_yaml import load_yaml
from distillery.errors import DistilleryError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from distillery.config import RunConfig
    from distillery.method_context import MethodContext


# -- specs: what a value of an option may be ---------------------------------------------------------
# A spec checks (and types) one value, raising a sentence that names the option, and says what it
# accepts: ``kind`` (the command-line flag's type) and ``accepts`` (the docs' words).


@dataclass(frozen=True)
class Number:
    """A finite number (an int with ``whole``) in [low, high], or (above, below) where given."""

    low: float | None = None
    high: float | None = None
    above: float | None = None
    below: float | None = None
    whole: bool = False
    optional: bool = False

    @property
    def kind(self) -> type:
        return int if self.whole else float

    def _limits(self) -> list[tuple[str, float]]:
        return [(op, bound) for op, bound in ((">=", self.low), (">", self.above), ("<=", self.high), ("<", self.below))
                if bound is not None]

    def accepts(self) -> str:
        kind = "whole number" if self.whole else "number"
        limits = " and ".join(f"{op} {bound:g}" for op, bound in self._limits())
        return f"{kind} {limits}".strip() if limits else kind

    def __call__(self, name: str, value: Any) -> Any:
        if value is None and self.optional:
            return None
        kind = "a whole number" if self.whole else "a number"
        ok_type = isinstance(value, int) if self.whole else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok_type or not math.isfinite(value):
            raise DistilleryError(f"Option {name} must be {kind}{' (or unset)' if self.optional else ''}, got {value!r}.")
        fits = {">=": lambda b: value >= b, ">": lambda b: value > b, "<=": lambda b: value <= b, "<": lambda b: value < b}
        limits = self._limits()
        if not all(fits[op](bound) for op, bound in limits):
            wanted = " and ".join(f"{op} {bound:g}" for op, bound in limits)
            raise DistilleryError(f"Option {name} must be {kind} {wanted}, got {value!r}.")
        return value if self.whole else float(value)


@dataclass(frozen=True)
class OneOf:
    choices: tuple[Any, ...]
    optional: bool = False

    kind: ClassVar[type] = str

    def accepts(self) -> str:
        return ", ".join(map(str, self.choices))

    def __call__(self, name: str, value: Any) -> Any:
        if value is None and self.optional:
            return None
        if value not in self.choices or isinstance(value, bool) != isinstance(self.choices[0], bool):
            raise DistilleryError(f"Option {name} must be one of {', '.join(map(str, self.choices))}, got {value!r}.")
        return value


@dataclass(frozen=True)
class Flag:
    optional: bool = False

    kind: ClassVar[type] = bool

    def accepts(self) -> str:
        return "true, false"

    def __call__(self, name: str, value: Any) -> Any:
        if (value is None and self.optional) or isinstance(value, bool):
            return value
        raise DistilleryError(f"Option {name} must be true or false, got {value!r}.")


@dataclass(frozen=True)
class Text:
    """A string (a path, a name); None where ``optional``."""

    optional: bool = False

    kind: ClassVar[type] = str

    def accepts(self) -> str:
        return "text"

    def __call__(self, name: str, value: Any) -> Any:
        if value is None and self.optional:
            return None
        if not isinstance(value, str) or not value:
            raise DistilleryError(f"Option {name} must be a non-empty string, got {value!r}.")
        return value


def number(low: float | None = None, high: float | None = None, *, above: float | None = None,
           below: float | None = None, whole: bool = False, optional: bool = False) -> Number:
    return Number(low, high, above, below, whole, optional)


def one_of(*choices: Any, optional: bool = False) -> OneOf:
    return OneOf(tuple(choices), optional)


def flag(optional: bool = False) -> Flag:
    return Flag(optional)


def text(optional: bool = False) -> Text:
    return Text(optional)


@dataclass(frozen=True)
class OptionSpec:
    """Everything said about one option besides its name and default.

    ``help``: one sentence, without the default (generated from it). ``default_text``: what a None default
    means (e.g. ``d_h/N``). ``paper``: the paper's name for it. ``flag``: ``compress`` has a flag for it
    (the others are ``--option key=value``); ``steps``: the method's step commands that take it as a flag.
    ``cli``: the flag's name where it is not the option's (``--backend`` for ``search_backend``)."""

    check: Any
    help: str
    default_text: str | None = None
    paper: str | None = None
    flag: bool = False
    steps: tuple[str, ...] = ()
    cli: str | None = None


def option(default: Any, spec: Any, help: str, *, default_text: str | None = None, paper: str | None = None,
           flag: bool = False, steps: tuple[str, ...] = (), cli: str | None = None) -> Any:
    """A field of a method's options: its default and its :class:`OptionSpec`."""
    return field(default=default, metadata={"spec": OptionSpec(spec, help, default_text, paper, flag, steps, cli)})


def augment_option(default_text: str | None = None) -> Any:
    """Option ``augment`` of every method that trains on the student's text (MethodContext.distillation_train).
    With ``default_text`` its default is None, which the method resolves (distill: the deep-cut rule's)."""
    return option(None if default_text else 0, number(0, 1000, whole=True, optional=bool(default_text)),
                  "TinyBERT augmentation: new examples per train example, each word replaced with p 0.4 by one of "
                  "15 candidates, all labelled by the teacher (0 = off; the new rows are capped at 200k)",
                  paper="N", flag=True, default_text=default_text)


@dataclass(frozen=True)
class OptionInfo:
    """One option as the command line and the docs see it."""

    name: str  # what a user writes (``lambda``)
    field: str  # the dataclass field (``lam``)
    default: Any
    spec: OptionSpec

    @property
    def flag_name(self) -> str:
        return "--" + (self.spec.cli or self.name).replace("_", "-")

    def default_words(self) -> str:
        if self.default is None:
            return self.spec.default_text or "unset"
        return str(self.default).lower() if isinstance(self.default, bool) else str(self.default)


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
                setattr(self, f.name, spec.check(self._name(f.name), getattr(self, f.name)))
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
    def specs(cls) -> list[OptionInfo]:
        """Every option with its spec, in declaration order."""
        return [OptionInfo(cls._name(f.name), f.name, f.default, f.metadata["spec"]) for f in fields(cls)]

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
        return spec.check(name, value) if spec is not None else value


# -- the method object ------------------------------------------------------------------------------


class Method:
    """One compression method. Subclasses set ``name`` and implement :meth:`run` (and :meth:`check`
    where the teacher's config rules options out). Its options are ``<package>.options.Options``;
    its budgets and presets are data in ``<package>/presets.yaml``, in dotted keys as
    ``--config``'s settings once flattened (``student.lr``, ``method_options.lambda``)."""

    name: ClassVar[str]
    # it reads nothing of the teacher but its outputs: an ONNX or int8 export is a teacher too
    teacher_outputs_only: ClassVar[bool] = False
    # task kinds (distillery.kinds) it does not compress yet: refused in a sentence before anything is trained
    unhandled_kinds: ClassVar[tuple[str, ...]] = ()

    def check_kind(self, task, config: RunConfig) -> None:
        """Refuse a task whose kind this method (with ``config``'s options) does not handle (:attr:`unhandled_kinds`)."""
        if task.kind in self.unhandled_kinds:
            raise DistilleryError(f"{self.name} does not handle {task.kind.replace('_', ' ')} yet (task "
                                  f"{task.name}); use --method distill.")

    @property
    def Options(self) -> type[MethodOptions]:  # noqa: N802 (a class, named as one)
        return method_options(self.name)

    def options(self, config: RunConfig) -> MethodOptions:
        return self.Options.read(config.method_options)

    def check(self, config: RunConfig, teacher_config) -> None:
        """Reject impossible options before minutes are spent fine-tuning the teacher."""
        self.options(config)

    def budget_overrides(self, budget: str) -> dict[str, Any]:
        """Dotted settings this method changes in the budget's defaults."""
        return dict(method_data(self.name).get("budgets", {}).get(budget) or {})

    def preset(self, preset: str, task: str) -> dict[str, Any]:
        """Dotted settings of a named preset (moebert ``paper``: Table 7's row for the task)."""
        return preset_settings(self.name, preset, task)

    def run(self, ctx: MethodContext) -> PreTrainedModel:
        """Build the student from ``ctx.teacher`` and train it with the one trainer (``ctx.train``)."""
        raise NotImplementedError


# -- what --method auto asks a method ---------------------------------------------------------------


@dataclass(frozen=True)
class AutoAsk:
    """What ``--method auto`` tells a method package's ``auto`` module, which answers with ``reach(ask)`` (its
    FLOP-ideal speed-up at best on this teacher, an upper bound; a DistilleryError where it cannot compress it)
    and ``candidates(ask)`` (the candidates that can meet ``speedup`` as ``distillery.auto.Candidate``'s fields:
    name, method, options, cost in passes of the teacher over the training data, why, expected share of the
    teacher's score kept; and those left out: name, method, reason). The module's ``PLANNED``, where it has one,
    names the options it sets per candidate itself, which auto refuses given."""

    teacher_config: Any
    speedup: float  # the speed-up a candidate must reach (a latency target over the teacher's latency here)
    seq: int  # the tokens a sentence of the latency measurement
    options: Mapping[str, Any]  # the method's options as given to auto
    teacher: str | None = None  # the teacher's name, folder or Hub id
    shape: tuple[int, ...] = (1, 128)  # the latency measurement's batch and tokens
    runs: int = 20  # timed runs of a latency measured while planning
    latency_ms: float | None = None  # the latency target, where it is one
    students: Any = None  # the pretrained students given (``--student``), each a candidate of its own
    # the int8 export's latency speed-up over fp32 measured here on the teacher's architecture (every candidate's
    # student gets one, and the choice weighs it): a candidate reaches the target when its fp32 speed-up times this
    # does; 1.0 where none was measured
    int8_gain: float = 1.0


# -- the registry -----------------------------------------------------------------------------------

# name -> the Method subclass ("<package>.recipe:<class>"). The recipe is imported only when the method runs, so
# that its dependencies load only then; everything else is read from the package's light modules and files.
METHODS: dict[str, str] = {
    "distill": "distillery.distill.recipe:Distill",
    "moebert": "distillery.moebert.recipe:MoEBert",
    "cmow": "distillery.cmow.recipe:CMOW",
    "autotinybert": "distillery.autotinybert.recipe:AutoTinyBert",
    "prune": "distillery.prune.recipe:Prune",
    "static": "distillery.static.recipe:Static",
}


def _known(name: str) -> None:
    if name not in METHODS:
        raise DistilleryError(f"Unknown method {name!r}; choose one of {', '.join(sorted(METHODS))}.")


def method_package(name: str) -> str:
    """The method's package: the one that holds its recipe module."""
    _known(name)
    return METHODS[name].split(":")[0].rpartition(".")[0]


def get_method(name: str) -> Method:
    """The method's object (its recipe module imported now)."""
    _known(name)
    module, cls = METHODS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def method_options(name: str) -> type[MethodOptions]:
    """The method's options dataclass, from its light ``options`` module."""
    return importlib.import_module(f"{method_package(name)}.options").Options


def method_module(name: str, module: str) -> Any:
    """The method package's optional light module ``module`` (``steps``, ``auto``), or None where it has none."""
    full = f"{method_package(name)}.{module}"
    return importlib.import_module(full) if importlib.util.find_spec(full) is not None else None


@cache
def method_data(name: str) -> dict[str, Any]:
    """The method's budgets and presets (``<package>/presets.yaml``)."""
    path = Path(importlib.import_module(method_package(name)).__file__).parent / "presets.yaml"
    return load_yaml(path.read_text()) or {} if path.is_file() else {}


def preset_settings(method: str, preset: str, task: str) -> dict[str, Any]:
    """Dotted settings of ``preset`` for ``task``: its ``all`` entry, then the task's."""
    presets = method_data(method).get("presets") or {}
    if not presets:
        raise DistilleryError(f"Method {method} has no presets.")
    if preset not in presets:
        raise DistilleryError(f"Unknown {method} preset {preset!r}; choose one of {', '.join(presets)}.")
    entry = presets[preset]
    tasks = entry.get("tasks") or {}
    if tasks and task not in tasks:
        raise DistilleryError(f"The {method} preset {preset!r} has no {entry.get('source', 'such')} settings for "
                              f"{task}; it has {', '.join(tasks)}.")
    return {**(entry.get("all") or {}), **(tasks.get(task) or {})}


def expected_at(measured: Mapping[float, float], share: float) -> float:
    """What a student of ``share`` of the teacher's size (the layers it keeps over the teacher's, or one over
    its speed-up) is expected to keep of the teacher's main metric: ``measured`` ({share: kept}, from
    distillery's own runs) interpolated linearly between the measured shares, extended along the line of the two
    smallest below them (a smaller student keeps less: at least 0), the largest's above, and never less than a
    smaller share keeps (shares measured under different defaults must not make the larger student the worse bet)."""
    shares = sorted(measured)
    points, best = [], 0.0
    for x in shares:
        best = max(best, measured[x])
        points.append((x, best))
    if share <= points[0][0]:
        if len(points) < 2:
            return points[0][1]
        (x0, y0), (x1, y1) = points[0], points[1]
        return max(0.0, y0 - (y1 - y0) * (x0 - share) / (x1 - x0))
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if share <= x1:
            return y0 + (y1 - y0) * (share - x0) / (x1 - x0)
    return points[-1][1]


# -- what a student's int8 export adds to its speed-up, for auto's plan ----------------------------------------------

# A narrowed student's int8 export is not as much faster than the student as the teacher's architecture's
# (AutoAsk.int8_gain): its matrices are smaller and unequal, and the embeddings' lookup, which int8 does not speed up,
# is a larger share of what is left. Measured at 1×128 against the teacher architecture's gain timed on the same
# machine: pruned students (benchmarks/results/prune-minilm-quick.json, cheap mode, teacher 1.64-1.89) kept all of it
# at 2× (int8 1.73-1.93× its fp32 student), about half at 4× (1.33-1.53×), none at 8× (0.96-1.11×); AutoTinyBERT's
# sub-networks at 4× kept 68 % and 85 % of it (int8 1.45× and 1.76× where the teacher's was 1.66× and 1.89×;
# benchmarks/results/auto-mrpc-4x.json, auto-stsb-4x.json). The share kept is taken linear in log2 of the fp32
# speed-up through the pruned students' three: all up to 2×, none from 8×.
INT8_SHARE_ALL, INT8_SHARE_NONE = 2.0, 8.0
# An int8 export's expected speed-up is planned this far past the target: the fp32 speed-up a search or a latency
# model aims at and the int8 gain at a shape each scatter by about 7 % as measured (the cheap prune's 1.85-2.05× at
# 2×, 3.77-4.14× at 4×); on RTE at 4× (benchmarks/results/auto-rte-4x.json) a cut planned at 2.95× with 5 % to spare
# measured 2.84× and its int8 export 3.77×, short of the target.
INT8_MARGIN = 1.10
# The lightest cut planned for its int8 export: below it the int8 export is about the free int8 teacher's, which auto
# measures beside every candidate anyway.
LIGHTEST_INT8_CUT = 1.2


def narrowed_int8_gain(speedup: float, teacher_gain: float) -> float:
    """How many times faster than its fp32 student the int8 export of a student narrowed to ``speedup`` (pruned,
    or a searched sub-network) is expected to run, where the teacher's architecture's runs ``teacher_gain`` times
    faster (:data:`INT8_SHARE_ALL`)."""
    low, high = math.log2(INT8_SHARE_ALL), math.log2(INT8_SHARE_NONE)
    share = min(1.0, max(0.0, (high - math.log2(max(speedup, 1.0))) / (high - low)))
    return 1.0 + (max(teacher_gain, 1.0) - 1.0) * share


def lightest_int8_cut(target: float, teacher_gain: float) -> float | None:
    """The lightest narrowed student from :data:`LIGHTEST_INT8_CUT` on (the smallest fp32 speed-up, to 0.01×) whose
    int8 export is expected to reach ``target`` with :data:`INT8_MARGIN` to spare (:func:`narrowed_int8_gain`); None
    where only the target itself does (the int8 export is no faster here, or the target is past where int8 gains)."""
    goal = target * INT8_MARGIN
    for hundredths in range(round(LIGHTEST_INT8_CUT * 100), math.ceil(target * 100)):
        speedup = hundredths / 100
        if speedup * narrowed_int8_gain(speedup, teacher_gain) >= goal:
            return speedup
    return None
