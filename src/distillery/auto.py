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
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from distillery.auto_budget import (EXPECTED_RETENTION, calibration, estimate_seconds, fits, not_fitting, pass_seconds,
                                    up_front)
from distillery.auto_choice import Target, choose, make_target, write_json  # noqa: F401 (auto's API)
from distillery.auto_report import finish
from distillery.config import BUILTIN_TEACHER, DEFAULT_TASK, parse_time_budget, run_inputs
from distillery.errors import DistilleryError
from distillery.folders import claim, locked, marker_kind
from distillery.markdown import fmt_ms, fmt_seconds, fmt_x
from distillery.method import METHODS, method_options

logger = logging.getLogger("distillery")

AUTO = "auto"
KIND = "auto"  # the marker kind of an auto folder
# Options auto sets per candidate: given by the user they would contradict the plan.
PLANNED_OPTIONS = ("student_layers", "budget_ms")
# Rough training cost of each method, in passes of the teacher over the training data (a forward is
# one, a backward two): times the teacher's measured seconds a pass, what a time budget expects it to take.
#   distill with k of L layers: the teacher's forward for the KD targets + the student's forward/backward.
#   moebert: + an importance pass, and its student is nearly the teacher's size.
#   cmow: the teacher labels the whole train split once; its student is a fraction of a layer.
#   autotinybert: a one-shot super-net (several sub-networks a step), the latency fit, the search, then
#   further training: the dearest by far.
COST_MOEBERT, COST_CMOW, COST_AUTOTINYBERT = 5.0, 1.5, 8.0


# --------------------------------------------------------------------------------------------
# The plan


@dataclass
class Candidate:
    name: str  # its folder under candidates/
    method: str
    options: dict[str, Any]
    cost: float  # estimated, in passes of the teacher over the training data
    why: str
    expected: float = 0.0  # the share of the teacher's score it is expected to keep (auto_budget.EXPECTED_RETENTION)
    estimated_seconds: float | None = None  # its training time, from the teacher's measured speed


def moebert_reach(teacher_config, seq: int, given: Mapping[str, Any]) -> tuple[float, str]:
    """MoEBERT's FLOP-ideal speed-up at ``seq`` tokens, and how it was computed.

    Per token and layer, attention costs 8d² (Q, K, V, output projections) + 4·seq·d (scores and
    context) FLOPs and the FFN 4·d·d_h (6·d·d_h with a GLU); MoEBERT keeps the attention and runs one
    expert of d_e neurons instead of the FFN, so at best it is
    (2d + seq + g·d_h) / (2d + seq + g·d_e) times faster (g = 1.5 for a GLU FFN, else 1; embeddings
    and head are left out, which only lowers the real figure)."""
    from distillery.encoders import ffn_width, layout_of
    from distillery.moebert.modeling_moebert import resolve_expert_shape

    layout = layout_of(teacher_config)
    d, d_h = int(teacher_config.hidden_size), ffn_width(layout, teacher_config)
    opts = method_options("moebert").read(given)
    _, d_e, _ = resolve_expert_shape(d_h, opts.experts, opts.expert_size, opts.shared)
    g = 1.5 if layout.glu else 1.0
    bound = (2 * d + seq + g * d_h) / (2 * d + seq + g * d_e)
    how = (f"(2d + seq + d_h) / (2d + seq + d_e) = (2·{d} + {seq} + {d_h}) / (2·{d} + {seq} + {d_e}) "
           f"= {bound:.2f}× ({opts.experts} experts of {d_e} of the {d_h} FFN neurons, attention unchanged)")
    return bound, how


def distill_depths(num_layers: int, speedup: float) -> list[int]:
    """Depths of the distill candidates: the deepest whose FLOP-ideal speed-up L/k meets S, and one
    shallower, since the embeddings and the head, which no layer-drop removes, keep the measured
    speed-up below L/k."""
    k = max(1, min(num_layers - 1, math.floor(num_layers / speedup + 1e-9)))
    return [k] + ([k - 1] if k > 1 else [])


def flop_reach(teacher_config, seq: int, options: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Each method's FLOP-ideal speed-up at best on this teacher, an upper bound (encoder multiply-adds a token
    at ``seq`` tokens): distill keeping one layer, MoEBERT's reach, AutoTinyBERT's smallest sub-network, CMOW's
    one d×d matrix product a token and direction."""
    from distillery.autotinybert.latency import arch_flops
    from distillery.autotinybert.space import SearchSpace
    from distillery.encoders import ffn_width, layout_of

    layout = layout_of(teacher_config)
    layers, d = int(teacher_config.num_hidden_layers), int(teacher_config.hidden_size)
    d_h, heads = ffn_width(layout, teacher_config), int(teacher_config.num_attention_heads)
    glu = 1.5 if layout.glu else 1.0
    teacher = layers * (4 * d * d + 2 * seq * d + glu * 2 * d * d_h)
    reach = {"distill": float(layers)}
    with contextlib.suppress(DistilleryError):  # MoEBERT cannot cut this teacher: plan() says why
        reach["moebert"] = moebert_reach(teacher_config, seq, options["moebert"])[0]
    atb = method_options("autotinybert").read(options["autotinybert"])
    smallest = SearchSpace.from_supernet(layers, d, d_h, heads, atb.strategy).smallest()
    reach["autotinybert"] = teacher / arch_flops(smallest, seq)
    cmow = method_options("cmow").read(options["cmow"])
    reach["cmow"] = teacher / (int(cmow.matrix_dim) ** 3 * (2 if cmow.bidirectional else 1))
    return reach


def check_reachable(teacher_config, speedup: float, seq: int, options: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse, before anything trains, a speed-up no candidate can reach even at its FLOP-ideal bound."""
    reach = flop_reach(teacher_config, seq, options)
    if speedup > max(reach.values()):
        bounds = ", ".join(f"{name} {fmt_x(x)}" for name, x in sorted(reach.items(), key=lambda kv: kv[1]))
        raise DistilleryError(f"No candidate can reach a {speedup:g}× speed-up over this teacher: their "
                              f"FLOP-ideal speed-ups at {seq} tokens are at most {bounds}, before any overhead. "
                              f"Ask for less (--speedup, --latency-ms).")


def plan(teacher_config, speedup: float, seq: int, options: Mapping[str, Mapping[str, Any]]
         ) -> tuple[list[Candidate], list[dict[str, str]]]:
    """The candidates that can meet a speed-up of ``speedup`` (the target itself, or the latency target
    over the teacher's latency measured here), the likely most accurate first, and the methods left out
    with the reason."""
    layers = int(getattr(teacher_config, "num_hidden_layers", 0) or 0)
    candidates, skipped = [], []
    if layers > 1:
        for i, k in enumerate(distill_depths(layers, speedup)):
            candidates.append(Candidate(f"distill-{k}l", "distill", {**options["distill"], "student_layers": k},
                                        1 + 3 * k / layers, f"{k} of the teacher's {layers} layers "
                                        f"(FLOP-ideal {layers / k:.2f}×)",
                                        EXPECTED_RETENTION["distill" if i == 0 else "distill-shallower"]))
    else:
        skipped.append({"name": "distill", "method": "distill",
                        "reason": "the teacher has a single layer, so dropping layers leaves nothing"})
    try:
        reach, how = moebert_reach(teacher_config, seq, options["moebert"])
    except DistilleryError as e:
        skipped.append({"name": "moebert", "method": "moebert", "reason": str(e)})
    else:
        if speedup > reach:
            skipped.append({"name": "moebert", "method": "moebert", "reason": f"its FLOP-ideal speed-up is at most "
                            f"{how}, below the {speedup:.2f}× needed"})
        else:
            candidates.append(Candidate("moebert", "moebert", dict(options["moebert"]), COST_MOEBERT,
                                        f"FLOP-ideal speed-up {how}", EXPECTED_RETENTION["moebert"]))
    candidates.append(Candidate("cmow", "cmow", dict(options["cmow"]), COST_CMOW,
                                "no attention: its speed does not depend on the teacher's depth",
                                EXPECTED_RETENTION["cmow"]))
    candidates.append(Candidate("autotinybert", "autotinybert", dict(options["autotinybert"]), COST_AUTOTINYBERT,
                                "a sub-network searched under the latency budget on this machine",
                                EXPECTED_RETENTION["autotinybert"]))
    # what each is expected to give first (a time budget then runs the likely best), the cheaper on a tie
    return sorted(candidates, key=lambda c: (-c.expected, c.cost)), skipped


def route_options(given: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The given method options dealt to the methods that have them (``kd_weight`` to all four); an
    option no method has, or one auto sets itself, is refused with a sentence."""
    planned = [k for k in given if k in PLANNED_OPTIONS]
    if planned:
        raise DistilleryError(f"--method auto chooses {', '.join(planned)} itself for its candidates; drop "
                              f"{'it' if len(planned) == 1 else 'them'}, or run that method alone.")
    routed: dict[str, dict[str, Any]] = {m: {} for m in METHODS}
    unknown = []
    for key, value in given.items():
        owners = [m for m in METHODS if key in method_options(m).names()]
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
    int8 export measured beside its student (every candidate point has its int8 twin)."""
    from distillery.pipeline import resolve_settings

    export = list(dict.fromkeys([*(shared.get("export") or []), "int8"]))
    return resolve_settings(shared, {"method": candidate.method, "out": str(out / "candidates" / candidate.name),
                                     "export": export,
                                     **{f"method_options.{k}": v for k, v in candidate.options.items()}})


def finished(folder: Path) -> bool:
    """A candidate whose run wrote its report (the last thing a run writes) is not run again."""
    return (folder / "report.md").is_file()


def estimate_costs(candidates: Sequence[Candidate], configs: Mapping[str, Any], teacher: Mapping[str, Any]) -> None:
    """Each candidate's ``estimated_seconds``: its cost in teacher passes over the examples its student
    learns from (the whole train split, unless it keeps to the budget's), at the teacher's measured speed."""
    for cand in candidates:
        config = configs[cand.name]
        per_pass = pass_seconds(teacher, config.teacher.train.epochs)
        budget_only = config.method_options.get("train_examples") == "budget"
        examples = teacher.get("train_examples") if budget_only else teacher.get("whole_split")
        epochs = config.student.epochs
        if not budget_only and (teacher.get("whole_split") or 0) > (teacher.get("train_examples") or 0):
            epochs = config.student.whole_split_epochs or epochs
        cand.estimated_seconds = estimate_seconds(cand.cost, per_pass, int(examples or 0), epochs)


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
    differing = [f"{k} (saved {saved.get(k)!r}, given {v!r})" for k, v in _normal(dict(settings)).items()
                 if v is not None and k not in ("out", "data.data_dir", "method") and saved.get(k) != v]
    if target is not None and asdict(target) != state["target"]:
        differing.append(f"the target (saved {Target(**state['target']).words()}, given {target.words()})")
    if differing:
        raise DistilleryError(f"--resume continues the auto run in {out} with its saved settings, but these were "
                              f"given differently: {'; '.join(differing)}. Drop them to resume, or choose another --out.")
    if settings.get("data.data_dir"):
        saved["data.data_dir"] = settings["data.data_dir"]
    keep = ("target", "settings", "time_budget_s", "teacher_ms", "plan_speedup")
    return {**{k: state.get(k) for k in keep}, "time_budget_s": time_budget or state.get("time_budget_s")}


def default_out(settings: Mapping[str, Any]) -> Path:
    task = settings.get("data.task") or DEFAULT_TASK
    return Path(settings.get("out") or Path("runs") / f"{task}-auto-{time.strftime('%Y%m%d-%H%M%S')}")


def plan_for(state: dict[str, Any]) -> tuple[list[Candidate], list[dict[str, str]], dict[str, Any], dict[str, Any]]:
    """The candidates of the run ``state`` describes (the teacher's latency measured here when the
    target is one), with the settings they share."""
    from distillery.teacher import teacher_config

    from distillery.auto_pretrained import pretrained_candidates

    shared, given = split_settings(state["settings"])
    students = given.pop("student", None)  # each one its own candidate, not an option of every distill one
    options = route_options(given)
    teacher = shared.get("teacher.name") or BUILTIN_TEACHER
    model_config = teacher_config(teacher)
    shape = tuple(shared.get("bench.latency_shape") or (1, 128))
    target = Target(**state["target"])
    if target.latency_ms is not None:
        if state.get("teacher_ms") is None:
            state["teacher_ms"] = teacher_latency_ms(model_config, shape, shared.get("bench.latency_runs") or 20)
        state["plan_speedup"] = state["teacher_ms"] / target.latency_ms
        if state["plan_speedup"] <= 1:
            raise DistilleryError(f"The teacher itself takes {fmt_ms(state['teacher_ms'])} ms here, within "
                                  f"--latency-ms {target.latency_ms:g}: it already meets the target.")
        options["autotinybert"]["budget_ms"] = target.latency_ms
    else:
        state["plan_speedup"] = target.speedup
        options["autotinybert"]["speedup"] = target.speedup
    check_reachable(model_config, state["plan_speedup"], int(shape[1]), options)
    candidates, skipped = plan(model_config, state["plan_speedup"], int(shape[1]), options)
    more, left = pretrained_candidates(students, teacher, model_config, state["plan_speedup"], shape,
                                       shared.get("bench.latency_runs") or 20, options["distill"])
    # the plan's order: what each is expected to keep first, the cheaper on a tie
    ordered = sorted(candidates + [Candidate(**c) for c in more], key=lambda c: (-c.expected, c.cost))
    return ordered, skipped + left, shared


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
