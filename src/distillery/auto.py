"""``compress --method auto``: the most accurate model that meets a latency target on this machine.

A user wants neither a MoEBERT nor a CMOW but the best model at their speed. ``auto`` plans the
candidates that can meet the target (a speed-up S over the teacher, or a latency of X ms), runs each
as an ordinary compress run in ``<out>/candidates/<name>/`` (so that each resumes like any run and is
kept), cheapest first within an overall time budget, measures every student and its int8 export in
its run's bench process beside the teacher and the live baselines, and chooses the most accurate
model whose *measured* speed-up (or latency) meets the target. ``<out>/report.md`` puts every
candidate point, the live baselines and the Pareto frontier in one report; ``<out>/auto.json``
records the plan, what ran, what was skipped and why, and the choice.

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

from distillery.config import parse_time_budget, run_inputs
from distillery.errors import DistilleryError
from distillery.folders import atomic_file, claim, locked, marker_kind
from distillery.markdown import fmt_metric, fmt_ms, fmt_seconds, fmt_x, md
from distillery.method import METHODS, method_options

logger = logging.getLogger("distillery")

AUTO = "auto"
KIND = "auto"  # the marker kind of an auto folder
# Options auto sets per candidate: given by the user they would contradict the plan.
PLANNED_OPTIONS = ("student_layers", "budget_ms")
# The run settings that are build_run_config's own arguments, not overrides.
NAMED = {"data.task": "task", "budget": "budget", "teacher.name": "teacher", "data.data_dir": "data_dir"}
DEFAULT_NAMED = {"task": "sst2", "budget": "quick", "teacher": "minilm", "data_dir": None}

# Rough training cost of each method, in passes of the teacher over the training data (a forward is
# one, a backward two). Only their order matters: it decides which candidates run first.
#   distill with k of L layers: the teacher's forward for the KD targets + the student's forward/backward.
#   moebert: + an importance pass, and its student is nearly the teacher's size.
#   cmow: the teacher labels the whole train split once; its student is a fraction of a layer.
#   autotinybert: a one-shot super-net (several sub-networks a step), the latency fit, the search, then
#   further training: the dearest by far.
COST_MOEBERT, COST_CMOW, COST_AUTOTINYBERT = 5.0, 1.5, 8.0


# --------------------------------------------------------------------------------------------
# What the user asks for


@dataclass(frozen=True)
class Target:
    """A measured speed-up over the teacher of at least ``speedup``, or a latency of at most ``latency_ms``."""

    speedup: float | None = None
    latency_ms: float | None = None

    def met_by(self, point: Mapping[str, Any]) -> bool:
        if self.latency_ms is not None:
            return point.get("latency_ms") is not None and point["latency_ms"] <= self.latency_ms
        return point.get("latency_speedup") is not None and point["latency_speedup"] >= self.speedup

    def words(self) -> str:
        if self.latency_ms is not None:
            return f"a latency of at most {fmt_ms(self.latency_ms)} ms"
        return f"a measured speed-up of at least {fmt_x(self.speedup)} over the teacher"


def make_target(speedup: float | None, latency_ms: float | None) -> Target:
    """The target from ``--speedup`` / ``--latency-ms``; a sentence where it is missing or impossible."""
    if speedup is None and latency_ms is None:
        raise DistilleryError("--method auto needs a target: --speedup S (e.g. 2 for twice the teacher's speed) "
                              "or --latency-ms X (on this machine).")
    if speedup is not None and latency_ms is not None:
        raise DistilleryError("Give --speedup or --latency-ms to --method auto, not both.")
    for name, value in (("--speedup", speedup), ("--latency-ms", latency_ms)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise DistilleryError(f"{name} must be a number, got {value!r}.")
    if speedup is not None and speedup <= 1:
        raise DistilleryError(f"--speedup must be above 1 (a model faster than the teacher), got {speedup:g}.")
    if latency_ms is not None and latency_ms <= 0:
        raise DistilleryError(f"--latency-ms must be above 0, got {latency_ms:g}.")
    return Target(float(speedup) if speedup is not None else None,
                  float(latency_ms) if latency_ms is not None else None)


# --------------------------------------------------------------------------------------------
# The plan


@dataclass
class Candidate:
    name: str  # its folder under candidates/
    method: str
    options: dict[str, Any]
    cost: float  # estimated, in passes of the teacher over the training data
    why: str


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
    over the teacher's latency measured here), cheapest first, and the methods left out with the reason."""
    layers = int(getattr(teacher_config, "num_hidden_layers", 0) or 0)
    candidates, skipped = [], []
    if layers > 1:
        for k in distill_depths(layers, speedup):
            candidates.append(Candidate(f"distill-{k}l", "distill", {**options["distill"], "student_layers": k},
                                        1 + 3 * k / layers, f"{k} of the teacher's {layers} layers "
                                        f"(FLOP-ideal {layers / k:.2f}×)"))
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
                                        f"FLOP-ideal speed-up {how}"))
    candidates.append(Candidate("cmow", "cmow", dict(options["cmow"]), COST_CMOW,
                                "no attention: its speed does not depend on the teacher's depth"))
    candidates.append(Candidate("autotinybert", "autotinybert", dict(options["autotinybert"]), COST_AUTOTINYBERT,
                                "a sub-network searched under the latency budget on this machine"))
    return sorted(candidates, key=lambda c: c.cost), skipped


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


def split_settings(settings: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Dotted settings (flags over a --config file) as build_run_config's named arguments, the
    overrides every candidate shares, and the method options to deal out (:func:`route_options`)."""
    named, overrides, options = dict(DEFAULT_NAMED), {}, {}
    for key, value in settings.items():
        if value is None or key in ("method", "out"):
            continue
        if key in NAMED:
            named[NAMED[key]] = value
        elif key.startswith("method_options."):
            options[key[len("method_options."):]] = value
        else:
            overrides[key] = value
    return named, overrides, options


def candidate_config(candidate: Candidate, named: Mapping[str, Any], overrides: Mapping[str, Any], out: Path):
    """The candidate's compress config: the shared settings, its own options, and the int8 export
    measured beside its student (every candidate point has its int8 twin)."""
    from distillery.pipeline import build_run_config

    export = list(dict.fromkeys([*(overrides.get("export") or []), "int8"]))
    return build_run_config(method=candidate.method, out=str(out / "candidates" / candidate.name), **named,
                            overrides={**overrides, "export": export,
                                       **{f"method_options.{k}": v for k, v in candidate.options.items()}})


def finished(folder: Path) -> bool:
    """A candidate whose run wrote its report (the last thing a run writes) is not run again."""
    return (folder / "report.md").is_file()


def run_candidates(candidates: Sequence[Candidate], configs: Mapping[str, Any], out: Path,
                   budget_s: float | None) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Each candidate's compress run, cheapest first, until the time budget is spent (one already
    running finishes); finished ones are re-entered without training. Returns what ran and what not."""
    from distillery.pipeline import compress

    started, ran, skipped = time.time(), [], []
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
        logger.info("auto: candidate %s (%s), %s.", cand.name, cand.method, cand.why)
        t0 = time.time()
        try:  # a folder with a saved config is an interrupted candidate: it continues from its checkpoint
            compress(configs[cand.name], resume=(folder / "config.yaml").is_file())
        except DistilleryError as e:  # this teacher or task rules the method out: the others still run
            logger.warning("auto: candidate %s could not run: %s", cand.name, e)
            skipped.append({"name": cand.name, "method": cand.method, "reason": str(e)})
            continue
        ran.append({"name": cand.name, "status": "trained", "seconds": round(time.time() - t0, 1)})
    return ran, skipped


# --------------------------------------------------------------------------------------------
# Choosing


def is_student_point(model: str) -> bool:
    return model == "student" or model.startswith("student-")


def point_name(candidate: str, model: str) -> str:
    """``distill-3l`` for a candidate's student, ``distill-3l+onnx-int8`` for its export."""
    return candidate if model == "student" else f"{candidate}+{model[len('student-'):]}"


def candidate_points(name: str, run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The student rows of a candidate's run (the student and its exports), as report rows."""
    from distillery.report import run_rows

    points = [r for r in run_rows(run) if is_student_point(r["model"])]
    for p in points:
        p["run"], p["point"], p["candidate"] = name, point_name(name, p["model"]), name
    return points


def _speed_words(p: Mapping[str, Any]) -> str:
    return f"{fmt_x(p['latency_speedup'])}, {fmt_ms(p['latency_ms'])} ms"


def choose(points: Sequence[Mapping[str, Any]], target: Target, main: str) -> tuple[dict[str, Any] | None, str]:
    """The most accurate point that meets the target as measured (ties: the faster), and the one
    sentence saying why, naming what it beat; None and a plain sentence when none meets it."""
    scored = [p for p in points if p["main"] is not None and p["latency_ms"] and p["latency_speedup"]]
    if not scored:
        return None, "No candidate finished with a score and a latency, so no model can be chosen."
    meeting = [p for p in scored if target.met_by(p)]
    if not meeting:
        fastest = min(scored, key=lambda p: p["latency_ms"])
        return None, (f"No candidate meets {target.words()} as measured here; the fastest is "
                      f"{md(fastest['point'], code=True)} ({_speed_words(fastest)}, {md(main)} "
                      f"{fmt_metric(fastest['main'])}).")
    best = max(meeting, key=lambda p: (p["main"], -p["latency_ms"]))
    text = (f"{md(best['point'], code=True)} is the most accurate of the {len(meeting)} candidate model(s) that "
            f"meet {target.words()} as measured here ({md(main)} {fmt_metric(best['main'])}, {_speed_words(best)})")
    rival = max((p for p in meeting if p is not best), key=lambda p: (p["main"], -p["latency_ms"]), default=None)
    if rival is not None:
        text += f"; it beats {md(rival['point'], code=True)} ({fmt_metric(rival['main'])}, {_speed_words(rival)})"
    better = max((p for p in scored if not target.met_by(p) and p["main"] > best["main"]),
                 key=lambda p: p["main"], default=None)
    if better is not None:
        text += (f", while the more accurate {md(better['point'], code=True)} ({fmt_metric(better['main'])}) "
                 f"misses the target ({_speed_words(better)})")
    return dict(best), text + "."


# --------------------------------------------------------------------------------------------
# The report and auto.json


def point_record(p: Mapping[str, Any], target: Target, out: Path) -> dict[str, Any]:
    """A point as auto.json keeps it, with the folder its model is saved in."""
    folder = out / "candidates" / p["candidate"]
    saved = folder / "student" if p["model"] == "student" else folder / "exports" / p["model"]
    return {"point": p["point"], "candidate": p["candidate"], "model": p["model"], "score": p["main"],
            "latency_ms": p["latency_ms"], "speedup": p["latency_speedup"], "meets_target": target.met_by(p),
            "folder": str(saved)}


def reference_rows(name: str, run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The teacher and the live baselines as measured in one candidate's run (beside its student)."""
    from distillery.live_baselines import BASELINE_NAMES
    from distillery.report import run_rows

    rows = [r for r in run_rows(run) if r["model"] in ("teacher", *BASELINE_NAMES)]
    for r in rows:
        r["run"], r["point"] = name, r["model"]
    return rows


def chosen_baselines(run: Mapping[str, Any], model: str, folder: str | None = None) -> str:
    """The report's live-baseline section with the chosen point in the student's place: the baselines
    were timed in the same process as it (its candidate's bench). ``folder``: where the chosen point lies,
    named in the sentence on what to deploy."""
    from distillery.live_baselines import baseline_section

    metrics, bench = dict(run["metrics"]), dict(run["bench"])
    paths = {"student": folder} if folder else None
    if model != "student":
        scores = {**(metrics.get("others") or {}), **(metrics.get("baselines") or {})}
        metrics["student"] = scores.get(model) or {}
        bench["models"] = {**bench["models"], "student": bench["models"].get(model)}
    return baseline_section(bench, metrics, metrics.get("baseline_notes") or (), students=("student",), paths=paths)


def report_lines(summary: Mapping[str, Any], rows: list[dict[str, Any]], runs: Mapping[str, Any]) -> list[str]:
    from distillery.bench import format_hardware
    from distillery.report import rows_table

    main, target, chosen = summary["main_metric"], Target(**summary["target"]), summary["chosen"]
    settings = summary["settings"]
    lines = [f"# auto on {md(summary['task'])}: the most accurate model at {target.words()}", "",
             f"- teacher: {md(settings.get('teacher.name', DEFAULT_NAMED['teacher']), code=True)}; budget "
             f"{md(settings.get('budget', DEFAULT_NAMED['budget']), code=True)}",
             f"- time budget: {fmt_seconds(summary['time_budget_s']) if summary['time_budget_s'] else 'none'}; "
             f"the candidates took {fmt_seconds(summary['seconds'])} ({fmt_seconds(summary['seconds_this_call'])} "
             f"in this call; a finished one is reused, not retrained)"]
    if summary.get("teacher_ms"):
        lines.append(f"- the teacher took {fmt_ms(summary['teacher_ms'])} ms here when planning, so the target is a "
                     f"{fmt_x(summary['plan_speedup'])} speed-up")
    lines += ["", "## Chosen model", "", summary["why"], ""]
    if chosen:
        lines += [f"Its folder: {md(chosen['folder'], code=True)}.", ""]
    lines += ["## Candidates", "", "Each candidate is an ordinary compress run in `candidates/<name>/` (its own "
              "report.md beside it); its student and its int8 export were scored on the same dev set and timed in "
              "the same process as its teacher. Speed-ups are against that teacher.", ""]
    skipped = {s["name"] for s in summary["skipped"]}
    for c in summary["candidates"]:
        if c["name"] in skipped:  # listed below, with the reason
            continue
        lines.append(f"- {md(c['name'], code=True)} ({md(c['method'])}: {md(c['why'])}), {c['status']}")
        for p in c.get("points", []):
            verdict = "meets the target" if p["meets_target"] else "misses the target"
            lines.append(f"  - {md(p['point'], code=True)}: {md(main)} {fmt_metric(p['score'])}, "
                         f"{fmt_ms(p['latency_ms'])} ms, {fmt_x(p['speedup'])}: {verdict}")
    for s in summary["skipped"]:
        lines.append(f"- {md(s['name'], code=True)} ({md(s['method'])}) skipped: {md(s['reason'])}")
    if rows:
        lines += ["", rows_table(rows, main, with_run=True)]
        hardware = next(iter(runs.values()))["bench"].get("hardware")
        lines += [f"Hardware: {md(format_hardware(hardware))}.", ""] if hardware else []
    return lines


def write_report(out: Path, summary: Mapping[str, Any], rows: list[dict[str, Any]], runs: Mapping[str, Any],
                 ref: str | None) -> Path:
    """``out/report.md`` (and ``plot.png``: every point with the Pareto frontier drawn)."""
    from distillery.plot import plot_points, write_plot

    lines = report_lines(summary, rows, runs)
    if ref is not None:
        chosen = summary["chosen"]
        lines += [chosen_baselines(runs[ref], chosen["model"] if chosen else "student",
                                   chosen["folder"] if chosen else None)]
    points = plot_points(rows, label_key="point")
    if points:
        main = summary["main_metric"]
        write_plot(points, out / "plot.png", main, title=f"auto on {summary['task']}: {main} vs latency")
        lines += ["![score against latency, Pareto frontier dashed](plot.png)", ""]
    path = out / "report.md"
    with atomic_file(path, "w") as f:  # a reader never finds half a report
        f.write("\n".join(lines).rstrip() + "\n")
    return path


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    with atomic_file(path, "w") as f:
        f.write(json.dumps(data, indent=2) + "\n")


def finish(out: Path, state: dict[str, Any], candidates: Sequence[Candidate], ran: Sequence[Mapping[str, Any]],
           skipped: Sequence[Mapping[str, str]]) -> Path:
    """Read the finished candidates, choose, and write ``auto.json``, ``report.md`` and ``plot.png``."""
    from distillery.report import load_run, main_metric

    target = Target(**state["target"])
    runs = {c.name: load_run(out / "candidates" / c.name) for c in candidates if finished(out / "candidates" / c.name)}
    first = next(iter(runs.values()), None)
    main = main_metric(first["metrics"]) if first else "score"
    points = {name: candidate_points(name, run) for name, run in runs.items()}
    chosen, why = choose([p for ps in points.values() for p in ps], target, main)
    ref = chosen["candidate"] if chosen else next(iter(runs), None)
    from distillery.bench.noise import noise_warning  # the bench package loads torch

    unstable = {name: warning for name, run in runs.items() if (warning := noise_warning(run["bench"]))}
    if chosen and chosen["candidate"] in unstable:  # the choice rests on this run's timings
        why += f" In its run: {unstable[chosen['candidate']]}"
    status = {r["name"]: r for r in ran}
    entries = []
    for c in candidates:
        # a reused candidate's time is its run's own record (train.json), not this call's
        seconds = runs[c.name]["train"].get("total_seconds") if c.name in runs else status.get(c.name, {}).get("seconds")
        entry = {**asdict(c), "status": status.get(c.name, {}).get("status", "skipped"),
                 "seconds": seconds, "folder": str(out / "candidates" / c.name),
                 "points": [point_record(p, target, out) for p in points.get(c.name, [])],
                 "timings_stable": c.name not in unstable if c.name in runs else None}
        entries.append(entry)
    baselines = reference_rows(ref, runs[ref]) if ref else []
    summary = {**state, "status": "done", "main_metric": main, "task": first["metrics"].get("task") if first else None,
               "seconds": round(sum(e["seconds"] or 0.0 for e in entries), 1),
               "seconds_this_call": round(sum(r.get("seconds") or 0.0 for r in ran), 1), "candidates": entries,
               "skipped": list(skipped), "chosen": point_record(chosen, target, out) if chosen else None, "why": why,
               "baselines": [{"model": r["model"], "score": r["main"], "latency_ms": r["latency_ms"],
                              "speedup": r["latency_speedup"], "measured_in": ref} for r in baselines]}
    summary["task"] = summary["task"] or state["settings"].get("data.task", "sst2")
    write_json(out / "auto.json", summary)
    rows = baselines + [p for ps in points.values() for p in ps]
    report = write_report(out, summary, rows, runs, ref)
    if chosen is None:  # the run's files say everything; the exit status says it failed
        raise DistilleryError(f"{why} Every candidate is in {report}.")
    logger.info("auto: %s", why)
    return report


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
    task = settings.get("data.task") or DEFAULT_NAMED["task"]
    return Path(settings.get("out") or Path("runs") / f"{task}-auto-{time.strftime('%Y%m%d-%H%M%S')}")


def plan_for(state: dict[str, Any]) -> tuple[list[Candidate], list[dict[str, str]], dict[str, Any], dict[str, Any]]:
    """The candidates of the run ``state`` describes (the teacher's latency measured here when the
    target is one), with the settings they share."""
    from distillery.teacher import teacher_config

    from distillery.auto_pretrained import pretrained_candidates

    named, overrides, given = split_settings(state["settings"])
    students = given.pop("student", None)  # each one its own candidate, not an option of every distill one
    options = route_options(given)
    model_config = teacher_config(named["teacher"])
    shape = tuple(overrides.get("bench.latency_shape") or (1, 128))
    target = Target(**state["target"])
    if target.latency_ms is not None:
        if state.get("teacher_ms") is None:
            state["teacher_ms"] = teacher_latency_ms(model_config, shape, overrides.get("bench.latency_runs") or 20)
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
    more, left = pretrained_candidates(students, named["teacher"], model_config, state["plan_speedup"], shape,
                                       overrides.get("bench.latency_runs") or 20, options["distill"])
    return sorted(candidates + [Candidate(**c) for c in more], key=lambda c: c.cost), skipped + left, named, overrides


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
    candidates, skipped, named, overrides = plan_for(state)
    # every candidate's settings are checked before the folder is touched
    configs = {c.name: candidate_config(c, named, overrides, out) for c in candidates}
    inputs = run_inputs(next(iter(configs.values())))
    with locked(out, wait=False):
        claim(out, KIND, overwrite=overwrite, resume=resume, inputs=inputs)
        (out / "candidates").mkdir(exist_ok=True)
        write_json(out / "auto.json", {**state, "status": "running", "candidates": [asdict(c) for c in candidates],
                                       "skipped": skipped})
        ran, not_run = run_candidates(candidates, configs, out, state["time_budget_s"])
        return finish(out, state, candidates, ran, skipped + not_run)
