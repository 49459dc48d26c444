"""``compress --method auto``: the most accurate model that meets a latency target on this machine.

A user wants neither a MoEBERT nor a CMOW but the best model at their speed. ``auto`` plans the
candidates that can meet the target (a speed-up S over the teacher, or a latency of X ms), fine-tunes the
teacher first, then runs each candidate as an ordinary compress run in ``<out>/candidates/<name>/`` (so
that each resumes like any run and is kept), the likely most accurate first, each only when its cost,
estimated from the teacher's measured speed, fits what is left of the time budget
(:mod:`distillery.auto_budget`). Every student and its int8 export is measured in its run's bench process
beside the teacher and the live baselines, and the most accurate model whose *measured* speed-up meets
the target is chosen, the free int8 teacher included (:mod:`distillery.auto_choice`). ``<out>/report.md``
puts every candidate point, the live baselines and the Pareto frontier in one report
(:mod:`distillery.auto_report`); ``<out>/auto.json`` records the plan, what ran, what was skipped and why,
and the choice.

auto is not a :class:`distillery.method.Method`: it composes the methods and adds no training of its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from distillery.auto_budget import (calibration, estimate_seconds, fits, not_fitting, pass_seconds,
                                    up_front)
from distillery.auto_choice import Target, choose, make_target, write_json  # noqa: F401 (auto's API)
from distillery.auto_report import finish
from distillery.config import BUILTIN_TEACHER, DEFAULT_TASK, check_resumed_settings, parse_time_budget, run_inputs
from distillery.distill import deep_cut
from distillery.errors import DistilleryError
from distillery.folders import claim, locked, marker_kind
from distillery.markdown import fmt_ms, fmt_seconds, fmt_x
from distillery.method import METHODS, AutoAsk, get_method, method_module, method_options
from distillery.safe_yaml import load_yaml

logger = logging.getLogger("distillery")

AUTO = "auto"
KIND = "auto"  # the marker kind of an auto folder

# --------------------------------------------------------------------------------------------
# The plan


@dataclass
class Candidate:
    name: str  # its folder under candidates/
    method: str
    options: dict[str, Any]
    cost: float  # estimated, in passes of the teacher over the training data
    why: str
    expected: float = 0.0  # the share of the teacher's score it is expected to keep (its method package's auto module)
    estimated_seconds: float | None = None  # its training time, from the teacher's measured speed
    exports: bool = True  # its student has an int8 export (a static embedder has none: a table lookup)
    # as deep a cut as a layer-drop student keeping this many of the teacher's teacher_layers (None: a method that
    # keeps its depth, or chooses it in its own search): a deep cut trains by distillery.distill.deep_cut's rule,
    # on the rule's augmented rows where the train split is small, which estimate_costs counts
    kept_layers: int | None = None
    teacher_layers: int | None = None
    kind_augments: bool = True  # the task's kind takes the rule's augmentation (TaskKind.augments_by_default)


def auto_modules(kind: str) -> dict[str, Any]:
    """Each method package's ``auto`` module (what auto needs to know of it), by method, for a task of kind ``kind``:
    a method without one is not tried, nor one that does not handle the kind (its ``unhandled_kinds``)."""
    return {m: module for m in METHODS
            if (module := method_module(m, "auto")) is not None and kind not in get_method(m).unhandled_kinds}


def flop_reach(asks: Mapping[str, AutoAsk]) -> dict[str, float]:
    """Each method's FLOP-ideal speed-up at best on this teacher, an upper bound (its package's ``reach``); a
    method that cannot compress this teacher is left out (plan() says why)."""
    reach = {}
    for method, ask in asks.items():
        with contextlib.suppress(DistilleryError):
            reach[method] = method_module(method, "auto").reach(ask)
    return reach


def check_reachable(asks: Mapping[str, AutoAsk]) -> None:
    """Refuse, before anything trains, a speed-up no candidate can reach even at its FLOP-ideal bound."""
    reach = flop_reach(asks)
    ask = next(iter(asks.values()))
    if ask.speedup > max(reach.values()):
        bounds = ", ".join(f"{name} {fmt_x(x)}" for name, x in sorted(reach.items(), key=lambda kv: kv[1]))
        raise DistilleryError(f"No candidate can reach a {ask.speedup:g}× speed-up over this teacher: their "
                              f"FLOP-ideal speed-ups at {ask.seq} tokens are at most {bounds}, before any overhead. "
                              f"Ask for less (--speedup, --latency-ms).")


def method_asks(teacher_config, speedup: float, seq: int, options: Mapping[str, Mapping[str, Any]],
                **more: Any) -> dict[str, AutoAsk]:
    """What auto tells each method's package, for each method of ``options`` (:func:`route_options`: those that
    handle the task's kind): the teacher, the target, its options (and ``more`` of AutoAsk's)."""
    return {m: AutoAsk(teacher_config, speedup, seq, dict(given), **more) for m, given in options.items()}


def plan(teacher_config, speedup: float, seq: int, options: Mapping[str, Mapping[str, Any]], **more: Any
         ) -> tuple[list[Candidate], list[dict[str, str]]]:
    """The candidates that can meet a speed-up of ``speedup`` (the target itself, or the latency target
    over the teacher's latency measured here), each method's package's, the likely most accurate first (the
    cheaper on a tie, so that a time budget runs the likely best), and the methods left out with the reason.
    ``more``: the rest of :class:`~distillery.method.AutoAsk` (the teacher's name, a latency target, the
    pretrained students given). The methods planned are those of ``options`` (:func:`route_options`)."""
    asks = method_asks(teacher_config, speedup, seq, options, **more)
    candidates, skipped = [], []
    for method, ask in asks.items():
        found, left = method_module(method, "auto").candidates(ask)
        candidates += [Candidate(**c) for c in found]
        skipped += left
    return sorted(candidates, key=lambda c: (-c.expected, c.cost)), skipped


def route_options(given: Mapping[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    """The given method options dealt to the methods auto tries on a task of kind ``kind`` that have them
    (``kd_weight`` to all), by method; an option no such method has, or one auto sets itself, is refused with a
    sentence."""
    modules = auto_modules(kind)
    # options a method's auto module sets per candidate (its PLANNED): given by the user they would contradict the plan
    planned = [k for k in given if any(k in getattr(module, "PLANNED", ()) for module in modules.values())]
    if planned:
        raise DistilleryError(f"--method auto chooses {', '.join(planned)} itself for its candidates; drop "
                              f"{'it' if len(planned) == 1 else 'them'}, or run that method alone.")
    routed: dict[str, dict[str, Any]] = {m: {} for m in modules}  # the methods auto tries
    unknown = []
    for key, value in given.items():
        owners = [m for m in routed if key in method_options(m).names()]
        unknown += [] if owners else [key]
        for m in owners:
            routed[m][key] = value
    if unknown:
        raise DistilleryError(f"No method that auto tries has the option(s) {', '.join(unknown)}; "
                              f"see `distillery compress --help`.")
    for m, options in routed.items():  # a bad value fails here, before any candidate trains, not in each of them
        try:
            method_options(m).read(options)
        except DistilleryError as e:
            raise DistilleryError(f"--method auto: {e}") from None
    return routed


def teacher_latency_ms(teacher_config, shape: Sequence[int], runs: int) -> float:
    """The teacher's latency here (a model of its architecture: the weights do not change the time),
    to turn ``--latency-ms`` into the speed-up the plan needs."""
    from transformers import AutoModel

    from distillery.bench import latency_ms

    model = AutoModel.from_config(teacher_config).eval()
    return latency_ms({"teacher": model}, tuple(shape), runs=max(int(runs), 3))["teacher"]


# int8 arithmetic does at most 4 times the fp32 work per cycle (VNNI): a timing above this was distorted by other
# work on the cores (measured 75x on a loaded 2-core machine, 2-3x on a quiet one)
INT8_GAIN_CAP = 4.0


def int8_gain(tokenizer, teacher_config, shape: Sequence[int], runs: int) -> float:
    """How many times faster than fp32 the default int8 export runs here, timed on a model of the teacher's
    architecture (random weights: they do not change the time). 1.0 where no int8 export can be made (its
    backend is missing, or this architecture does not export)."""
    from transformers import AutoModelForSequenceClassification

    from distillery.export import int8_speedup

    model = AutoModelForSequenceClassification.from_config(teacher_config).eval()
    try:
        timed = int8_speedup(model, tokenizer, shape, runs)
    except DistilleryError as e:
        logger.info("auto: no int8 export to time (%s); candidates are planned by their fp32 speed.", e)
        return 1.0
    gain = min(max(1.0, timed), INT8_GAIN_CAP)
    if timed > INT8_GAIN_CAP:
        logger.warning("auto: the int8 export timed %s as fast as fp32, more than int8 arithmetic gives (other work "
                       "on the cores slows the two unevenly); planned at %s.", fmt_x(timed), fmt_x(gain))
    logger.info("auto: the int8 export runs %s as fast as fp32 here, at %s.", fmt_x(gain), "×".join(map(str, shape)))
    return gain


# --------------------------------------------------------------------------------------------
# Running the candidates


def split_settings(settings: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Dotted settings (flags over a --config file) as the settings every candidate shares and the method
    options to deal out (:func:`route_options`)."""
    shared, options = {}, {}
    for key, value in settings.items():
        if value is None or key in ("method", "out"):
            continue
        if key.startswith("method_options."):
            options[key[len("method_options."):]] = value
        else:
            shared[key] = value
    return shared, options


def candidate_config(candidate: Candidate, shared: Mapping[str, Any], out: Path):
    """The candidate's compress config: the shared settings, then its own method, folder and options, and the
    int8 export measured beside its student (every candidate point has its int8 twin; a candidate whose student has
    no export, a static embedder, has none: --export is not passed to it)."""
    from distillery.pipeline import resolve_settings

    export = list(dict.fromkeys([*(shared.get("export") or []), "int8"])) if candidate.exports else []
    config = resolve_settings(shared, {"method": candidate.method, "out": str(out / "candidates" / candidate.name),
                                       "export": export,
                                       **{f"method_options.{k}": v for k, v in candidate.options.items()}})
    return config


def finished(folder: Path) -> bool:
    """A candidate whose run wrote its report (the last thing a run writes) is not run again."""
    return (folder / "report.md").is_file()


def estimate_costs(candidates: Sequence[Candidate], configs: Mapping[str, Any], teacher: Mapping[str, Any]) -> None:
    """Each candidate's ``estimated_seconds``: its cost in teacher passes over the rows its student reads (the
    whole train split, unless it keeps to the budget's; a deep cut's as the rule has it,
    :func:`student_rows`), at the teacher's measured speed, and one teacher pass over each new row it labels."""
    for cand in candidates:
        config = configs[cand.name]
        per_pass = pass_seconds(teacher, config.teacher.train.epochs)
        rows, new_rows = student_rows(cand, config, teacher)
        seconds = estimate_seconds(cand.cost, per_pass, rows)
        cand.estimated_seconds = None if seconds is None else seconds + per_pass * new_rows


def student_rows(cand: Candidate, config, teacher: Mapping[str, Any]) -> tuple[float, int]:
    """The rows ``cand``'s student reads over its training and the new rows the teacher labels for it: the
    budget's passes over the examples it learns from, or, for a deep cut (``kept_layers``), what the deep-cut rule
    makes of them (its augmentation where the split is small and the user gave none, its passes and least steps)."""
    budget_only = config.method_options.get("train_examples") == "budget"
    examples = int((teacher.get("train_examples") if budget_only else teacher.get("whole_split")) or 0)
    epochs = config.student.epochs
    if not budget_only and (teacher.get("whole_split") or 0) > (teacher.get("train_examples") or 0):
        epochs = config.student.whole_split_epochs or epochs
    if cand.kept_layers is None or not cand.teacher_layers:
        return examples * max(float(epochs), 1e-9), 0
    given = config.method_options.get("augment")
    if given is None:
        augment, why = deep_cut.default_augment(cand.kept_layers, cand.teacher_layers,
                                                int(teacher.get("train_examples") or 0), cand.kind_augments)
    else:
        augment, why = int(given), None
    batch = config.student.batch_size * config.student.grad_accum
    rows = deep_cut.rows_read(cand.kept_layers, cand.teacher_layers, examples, epochs, batch, augment,
                              why is not None)
    return rows, examples * augment


def reuse_work(cand: Candidate, candidates: Sequence[Candidate], configs: Mapping[str, Any], out: Path) -> None:
    """What another candidate of the same method left that ``cand`` can start from (its package's auto ``reuse``:
    AutoTinyBERT's super-net, so that a second search under another budget skips the one-shot phase): set in its
    options and config before it runs, and its estimate scaled to the cost left. A candidate that already started
    (its folder has its config) keeps what it started with: it is said only where it started from it."""
    reuse = getattr(method_module(cand.method, "auto"), "reuse", None)
    siblings = [out / "candidates" / c.name for c in candidates if c.method == cand.method and c is not cand]
    found = reuse(cand.options, siblings) if reuse is not None else None
    if found is None:
        return
    options, cost, words = found
    saved = out / "candidates" / cand.name / "config.yaml"
    if saved.is_file():
        started = (load_yaml(saved.read_text()) or {}).get("method_options") or {}
        if any(started.get(k) != v for k, v in options.items()):
            return
    cand.options.update(options)
    configs[cand.name].method_options.update(options)
    if cand.estimated_seconds:
        cand.estimated_seconds *= cost / cand.cost
    cand.cost, cand.why = cost, f"{cand.why}; {words}"


def run_candidates(candidates: Sequence[Candidate], configs: Mapping[str, Any], out: Path,
                   budget_s: float | None, started: float | None = None
                   ) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Each candidate's compress run, in the plan's order, while the time budget (counted from ``started``:
    the teacher's fine-tuning is part of it) lasts: one starts only when its estimated time, scaled by how far
    off the finished candidates' estimates were, fits what is left; one already running finishes. Finished
    ones are re-entered without training. Returns what ran and what not."""
    from distillery.pipeline import compress

    started = time.time() if started is None else started
    ran, skipped, measured = [], [], []
    for cand in candidates:
        folder = out / "candidates" / cand.name
        reuse_work(cand, candidates, configs, out)
        if finished(folder):
            ran.append({"name": cand.name, "status": "reused", "seconds": 0.0})
            continue
        spent = time.time() - started
        if budget_s is not None and spent >= budget_s:
            skipped.append({"name": cand.name, "method": cand.method, "reason": f"the time budget of "
                            f"{fmt_seconds(budget_s)} was spent ({fmt_seconds(spent)}) before it could start"})
            continue
        estimate = cand.estimated_seconds * calibration(measured) if cand.estimated_seconds else None
        if not fits(estimate, spent, budget_s):
            skipped.append({"name": cand.name, "method": cand.method, "reason": not_fitting(estimate, spent, budget_s)})
            continue
        logger.info("auto: candidate %s (%s), %s%s.", cand.name, cand.method, cand.why,
                    f"; estimated {fmt_seconds(estimate)}" if estimate else "")
        t0 = time.time()
        try:  # a folder with a saved config is an interrupted candidate: it continues from its checkpoint
            compress(configs[cand.name], resume=(folder / "config.yaml").is_file())
        except DistilleryError as e:  # this teacher or task rules the method out: the others still run
            logger.warning("auto: candidate %s could not run: %s", cand.name, e)
            skipped.append({"name": cand.name, "method": cand.method, "reason": str(e)})
            continue
        ran.append({"name": cand.name, "status": "trained", "seconds": round(time.time() - t0, 1)})
        if cand.estimated_seconds:
            measured.append((cand.estimated_seconds, time.time() - t0))
    return ran, skipped


def _normal(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def resumed_state(out: Path, settings: Mapping[str, Any], target: Target | None,
                  time_budget: float | None) -> dict[str, Any]:
    """The saved state of the auto run in ``out``: its settings and target, which a --resume keeps
    (one given differently is refused, as for a run; only the data folder may move)."""
    if marker_kind(out) != KIND or not (out / "auto.json").is_file():
        raise DistilleryError(f"Cannot resume: {out} holds no auto.json of an earlier --method auto run.")
    state = json.loads((out / "auto.json").read_text())
    saved = state["settings"]
    was = dict(saved)
    given = {k: v for k, v in _normal(dict(settings)).items() if v is not None and k not in ("out", "data.data_dir", "method")}
    if target is not None and asdict(target) != state["target"]:  # the target, when given, is a setting too
        was["target"], given["target"] = Target(**state["target"]).words(), target.words()
    check_resumed_settings(out, was, given, "Drop them to resume, or choose another --out.")
    if settings.get("data.data_dir"):
        saved["data.data_dir"] = settings["data.data_dir"]
    keep = ("target", "settings", "time_budget_s", "teacher_ms", "plan_speedup", "int8_gain")
    return {**{k: state.get(k) for k in keep}, "time_budget_s": time_budget or state.get("time_budget_s")}


def default_out(settings: Mapping[str, Any]) -> Path:
    task = settings.get("data.task") or DEFAULT_TASK
    return Path(settings.get("out") or Path("runs") / f"{task}-auto-{time.strftime('%Y%m%d-%H%M%S')}")


def plan_for(state: dict[str, Any]) -> tuple[list[Candidate], list[dict[str, str]], dict[str, Any]]:
    """The candidates of the run ``state`` describes (the teacher's latency measured here when the
    target is one), with the settings they share. The methods planned are those that handle the task's kind."""
    from distillery.data.loading import kind_for
    from distillery.teacher import teacher_config, teacher_tokenizer

    shared, given = split_settings(state["settings"])
    students = given.pop("student", None)  # each one its own candidate, not an option of every distill one
    task_kind = kind_for(shared.get("data.task") or DEFAULT_TASK, bool(shared.get("data.regression")))
    options = route_options(given, task_kind.name)
    teacher = shared.get("teacher.name") or BUILTIN_TEACHER
    model_config = teacher_config(teacher)
    shape = tuple(shared.get("bench.latency_shape") or (1, 128))
    runs = shared.get("bench.latency_runs") or 20
    target = Target(**state["target"])
    if target.latency_ms is not None:
        if state.get("teacher_ms") is None:
            state["teacher_ms"] = teacher_latency_ms(model_config, shape, runs)
        state["plan_speedup"] = state["teacher_ms"] / target.latency_ms
        if state["plan_speedup"] <= 1:
            raise DistilleryError(f"The teacher itself takes {fmt_ms(state['teacher_ms'])} ms here, within "
                                  f"--latency-ms {target.latency_ms:g}: it already meets the target.")
    else:
        state["plan_speedup"] = target.speedup
    more = {"teacher": teacher, "shape": shape, "runs": runs, "latency_ms": target.latency_ms, "students": students}
    # a target past every candidate even with the most int8 arithmetic gives is refused before the export is timed
    check_reachable(method_asks(model_config, state["plan_speedup"], int(shape[1]), options, **more,
                                int8_gain=INT8_GAIN_CAP))
    if state.get("int8_gain") is None:  # measured once: a resumed run keeps its plan
        state["int8_gain"] = (int8_gain(teacher_tokenizer(teacher), model_config, shape, runs)
                              if shared.get("int8", True) else 1.0)
    more["int8_gain"] = state["int8_gain"]
    check_reachable(method_asks(model_config, state["plan_speedup"], int(shape[1]), options, **more))
    candidates, skipped = plan(model_config, state["plan_speedup"], int(shape[1]), options, **more)
    for cand in candidates:
        cand.kind_augments = task_kind.augments_by_default
    return candidates, skipped, shared


def compress_auto(settings: Mapping[str, Any], *, speedup: float | None = None, latency_ms: float | None = None,
                  time_budget: str | float | None = None, overwrite: bool = False, resume: bool = False) -> Path:
    """``compress --method auto``: plan, run and compare the candidates; return ``<out>/report.md``.

    ``settings``: dotted run settings as ``compress`` takes them (``data.task``, ``teacher.name``,
    ``student.epochs``, ``method_options.kd_weight``...), every candidate's; the method options go to
    the methods that have them. ``time_budget``: "2h", "30m", seconds."""
    budget_s = parse_time_budget(time_budget)
    out = default_out(settings)
    given_target = None if resume and speedup is None and latency_ms is None else make_target(speedup, latency_ms)
    if resume:
        state = resumed_state(out, settings, given_target, budget_s)
    elif not overwrite and marker_kind(out) == KIND:
        raise DistilleryError(f"{out} holds an earlier --method auto run; pass --resume to continue it (its finished "
                              f"candidates are kept) or --overwrite to replace it.")
    else:
        state = {"target": asdict(given_target), "time_budget_s": budget_s, "teacher_ms": None, "plan_speedup": None,
                 "int8_gain": None,
                 "settings": _normal({k: v for k, v in settings.items() if v is not None and k not in ("out", "method")})}
    candidates, skipped, shared = plan_for(state)
    # every candidate's settings are checked before the folder is touched
    configs = {c.name: candidate_config(c, shared, out) for c in candidates}
    inputs = run_inputs(next(iter(configs.values())))
    with locked(out, wait=False):
        claim(out, KIND, overwrite=overwrite, resume=resume, inputs=inputs)
        (out / "candidates").mkdir(exist_ok=True)
        started = time.time()  # the time budget counts the teacher's fine-tuning
        state["teacher"] = teacher_phase(configs[candidates[0].name], candidates, configs, state["time_budget_s"])
        write_json(out / "auto.json", {**state, "status": "running", "candidates": [asdict(c) for c in candidates],
                                       "skipped": skipped})
        ran, not_run = run_candidates(candidates, configs, out, state["time_budget_s"], started=started)
        return finish(out, state, candidates, ran, skipped + not_run)


def teacher_phase(config, candidates: Sequence[Candidate], configs: Mapping[str, Any],
                  budget_s: float | None) -> dict[str, Any]:
    """The teacher fine-tuned (or read from the cache) before any candidate, timed; each candidate's cost
    estimated from its measured speed; the candidates that will not fit the budget said up front."""
    from distillery.pipeline import prepare_teacher

    t0 = time.time()
    teacher = prepare_teacher(config)
    teacher["spent_seconds"] = round(time.time() - t0, 1)
    estimate_costs(candidates, configs, teacher)
    teacher["not_fitting"] = up_front([c.name for c in candidates], {c.name: c.estimated_seconds for c in candidates},
                                      teacher["spent_seconds"], budget_s)
    for name, reason in teacher["not_fitting"].items():
        logger.warning("auto: candidate %s will probably not run: %s.", name, reason)
    return teacher
