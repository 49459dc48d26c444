"""What ``--method auto`` measured and chose: the target, each candidate's points (its student, the student's
int8 export, and the free int8 teacher) and the choice; :mod:`distillery.auto_report` writes them out.

A point is judged only by ratios to the teacher timed in the same process as it (its candidate's
bench.json): candidates run in different processes, where one teacher took 18 ms and another 340 ms under
load. A target missed by less than the measurement's own noise counts as met, and the report says so. A
candidate whose student learned too little (closer to chance than to the teacher) is not chosen.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from distillery.errors import DistilleryError
from distillery.folders import atomic_file
from distillery.markdown import fmt_metric, fmt_ms, fmt_x, md
from distillery.run_record import BASELINE_NAMES, INT8_NAME, Bench, Metrics, Run, is_student, run_rows

FREE_INT8 = INT8_NAME  # the point and the folder of the free int8 teacher
# A point may fall short of the target by its timing's own spread (p90 over median of its passes, or its
# teacher's), at most this much: beyond it a user asking for 2× would not get it.
MAX_NOISE_ALLOWANCE = 0.05
# A student that closes less than this share of the gap between chance and the teacher failed to learn
# (a 2-of-6-layer pair-task student once reached 0.622 against a teacher of 0.844 and a majority class of 0.564).
MIN_GAP_CLOSED = 0.5


@dataclass(frozen=True)
class Target:
    """A measured speed-up over the teacher of at least ``speedup``, or a latency of at most ``latency_ms``.

    A point is judged by its speed-up over the teacher timed in its own process, never by milliseconds
    across processes; a latency target is turned into the speed-up it needs over the teacher timed when
    planning (:meth:`for_choice`)."""

    speedup: float | None = None
    latency_ms: float | None = None

    def for_choice(self, plan_speedup: float | None) -> "Target":
        """The target as points are judged: a latency target with the speed-up it means here."""
        if self.latency_ms is None or plan_speedup is None:
            return self
        return Target(float(plan_speedup), self.latency_ms)

    def met_by(self, point: Mapping[str, Any]) -> bool:
        """The point's speed-up reaches the target, or falls short by less than its measurement's noise
        (``noise``, :func:`timing_noise`)."""
        speed = point.get("latency_speedup")
        if speed is None or self.speedup is None:
            return False
        return speed * (1.0 + float(point.get("noise") or 0.0)) >= self.speedup

    def met_within_noise(self, point: Mapping[str, Any]) -> bool:
        """Met only thanks to the noise allowance: the report says so."""
        return self.met_by(point) and point["latency_speedup"] < self.speedup

    def words(self) -> str:
        if self.latency_ms is not None:
            extra = f" (a {fmt_x(self.speedup)} speed-up over the teacher timed here)" if self.speedup else ""
            return f"a latency of at most {fmt_ms(self.latency_ms)} ms{extra}"
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
# The points


def timing_noise(bench: Bench, model: str) -> float:
    """The relative noise of a model's speed-up in its bench record: the larger spread of its timing and its
    teacher's (bench.json ``noise.spread``), at most :data:`MAX_NOISE_ALLOWANCE`; 0 where nothing was judged."""
    values = [v for v in (bench.noise_spread(model), bench.noise_spread("teacher")) if v is not None]
    return min(max(values, default=0.0), MAX_NOISE_ALLOWANCE)


def learned_too_little(score: float, metrics: Metrics) -> str | None:
    """A sentence when a model's ``score`` closes less than :data:`MIN_GAP_CLOSED` of the gap between chance
    (metrics.json ``chance``) and the teacher, else None (also where the teacher itself is near chance)."""
    chance, main = metrics.chance_level(), metrics.main_metric
    teacher = (metrics.teacher or {}).get(main)
    if chance is None or not isinstance(teacher, (int, float)) or score is None:
        return None
    gap = teacher - chance.main
    if gap <= chance.margin:  # the teacher at chance is the report's own warning
        return None
    closed = (score - chance.main) / gap
    if closed >= MIN_GAP_CLOSED:
        return None
    return (f"it failed to learn: {main} {fmt_metric(score)} closes {100 * max(closed, 0.0):.0f} % of the gap between "
            f"chance ({fmt_metric(chance.main)}) and the teacher ({fmt_metric(teacher)})")


# The two-sided 95 % normal quantile: two dev scores closer than this many standard errors are tied
TIE_Z = 1.96
CORRELATIONS = ("pearson", "spearman", "mcc")


def sampling_noise(metric: str, score: float | None, examples: int | None) -> float | None:
    """Half the width of a 95 % interval of a dev score from ``examples`` examples: binomial for a rate
    (accuracy, F1, SQuAD's percentages; for a mean of values in [0, 1] such as MRR@10, an upper bound), the
    Fisher-z standard error for a correlation, at the score itself.
    None where the number of examples is unknown (a run older than metrics.json's ``dev_examples``)."""
    if score is None or not examples or examples < 4:
        return None
    if metric in CORRELATIONS or metric.endswith(tuple(f"_{c}" for c in CORRELATIONS)):  # an embedder's sts_spearman
        r = min(abs(float(score)), 0.999)
        return TIE_Z * (1.0 - r * r) / math.sqrt(examples - 3)
    scale = 100.0 if score > 1.0 else 1.0  # SQuAD's exact match and F1 are percentages
    p = min(max(float(score) / scale, 0.0), 1.0)
    return scale * TIE_Z * math.sqrt(max(p * (1.0 - p), 1.0 / examples) / examples)


def point_name(candidate: str, model: str) -> str:
    """``distill-3l`` for a candidate's student, ``distill-3l+onnx-int8`` for its export."""
    return candidate if model == "student" else f"{candidate}+{model[len('student-'):]}"


def candidate_points(name: str, run: Run) -> list[dict[str, Any]]:
    """The student rows of a candidate's run (the student and its exports), as report rows with their
    timing noise and, for a student that learned too little, ``failed``."""
    points = [r for r in run_rows(run) if is_student(r["model"])]
    for p in points:
        p["run"], p["point"], p["candidate"] = name, point_name(name, p["model"]), name
        p["noise"] = timing_noise(run.bench, p["model"])
        p["failed"] = learned_too_little(p["main"], run.metrics)
        p["dev_examples"], p["tie_metrics"] = run.metrics.dev_examples, run.metrics.tie_metrics
    return points


def reference_rows(name: str, run: Run) -> list[dict[str, Any]]:
    """The teacher and the live baselines as measured in one candidate's run (beside its student)."""
    rows = [r for r in run_rows(run) if r["model"] in ("teacher", *BASELINE_NAMES)]
    for r in rows:
        r["run"], r["point"] = name, r["model"]
    return rows


def free_int8_point(runs: Mapping[str, Run]) -> dict[str, Any] | None:
    """The free int8 teacher as a candidate point: measured in every candidate's run beside its teacher, it
    is taken from the run of the median speed-up (one run's burst of load does not make it)."""
    rows = [(name, r) for name, run in runs.items() for r in reference_rows(name, run)
            if r["model"] == FREE_INT8 and r["main"] is not None and r["latency_speedup"]]
    if not rows:
        return None
    rows.sort(key=lambda nr: nr[1]["latency_speedup"])
    name, row = rows[(len(rows) - 1) // 2]
    return {**row, "candidate": FREE_INT8, "point": FREE_INT8, "free": True, "measured_in": name,
            "noise": timing_noise(runs[name].bench, FREE_INT8), "failed": None,
            "dev_examples": runs[name].metrics.dev_examples, "tie_metrics": runs[name].metrics.tie_metrics}


def _speed_words(p: Mapping[str, Any]) -> str:
    return f"{fmt_x(p['latency_speedup'])}, {fmt_ms(p['latency_ms'])} ms"


def _name(p: Mapping[str, Any]) -> str:
    what = md(p["point"], code=True)
    return f"the free int8 teacher {what}" if p.get("free") else what


def choose(points: Sequence[Mapping[str, Any]], target: Target, main: str) -> tuple[dict[str, Any] | None, str]:
    """The most accurate point that meets the target as measured, and the one sentence saying why, naming
    what it beat; None and a plain sentence when none meets it. A point that ``failed`` to learn is never
    chosen. Points whose dev scores lie within the dev set's sampling noise of the most accurate one
    (:func:`sampling_noise`: 3 examples of 500 tell nothing apart) are tied, and the fastest of them is chosen; where
    the kind names other metrics to read (``tie_metrics``: an embedder's retrieval beside STS-B), a point that falls
    behind the most accurate one on any of them by more than its noise is not tied."""
    scored = [p for p in points if p["main"] is not None and p["latency_ms"] and p["latency_speedup"]]
    if not scored:
        return None, "No candidate finished with a score and a latency, so no model can be chosen."
    meeting = [p for p in scored if target.met_by(p) and not p.get("failed")]
    if not meeting:
        fastest = max(scored, key=lambda p: p["latency_speedup"])
        failed = [p for p in scored if target.met_by(p) and p.get("failed")]
        extra = (f" {md(failed[0]['point'], code=True)} meets it, but {md(failed[0]['failed'])}." if failed else "")
        return None, (f"No candidate meets {target.words()} as measured here; the fastest is "
                      f"{md(fastest['point'], code=True)} ({_speed_words(fastest)}, {md(main)} "
                      f"{fmt_metric(fastest['main'])}).{extra}")
    rank = lambda p: (p["main"], p["latency_speedup"])  # noqa: E731 (equal scores: the faster, as a ratio)
    top = max(meeting, key=rank)
    noise = sampling_noise(main, top["main"], top.get("dev_examples"))
    also = {}  # the kind's other metrics ties read: the top's value, its sampling noise, the examples it is over
    for m, n in (top.get("tie_metrics") or {}).items():
        value = (top.get("metrics") or {}).get(m)
        margin = sampling_noise(m, value, n)
        if margin is not None:
            also[m] = (value, margin, n)

    def behind(p) -> list[str]:  # the other metrics on which p falls behind the top by more than their noise
        return [m for m, (value, margin, _) in also.items()
                if (p.get("metrics") or {}).get(m) is not None and value - p["metrics"][m] >= margin]

    within = [p for p in meeting if noise is not None and top["main"] - p["main"] < noise]
    tied = [p for p in within if not behind(p)]
    best = max(tied, key=lambda p: (p["latency_speedup"], p["main"])) if len(tied) > 1 else top
    if len(tied) <= 1:
        text = (f"{_name(best)} is the most accurate of the {len(meeting)} model(s) that meet {target.words()} as "
                f"measured here ({md(main)} {fmt_metric(best['main'])}, {_speed_words(best)}")
    else:
        others = ", ".join(f"{_name(p)} ({fmt_metric(p['main'])})" for p in tied if p is not best)
        text = (f"{_name(best)} ({md(main)} {fmt_metric(best['main'])}, {_speed_words(best)}) is tied on dev with "
                f"{others}: their scores lie within ±{fmt_metric(noise)}, the 95 % sampling interval of {md(main)} "
                f"over {top['dev_examples']} dev examples, so the fastest of them is chosen among the "
                f"{len(meeting)} model(s) that meet {target.words()} as measured here")
        if also:
            text += " (" + ", ".join(f"{md(m)} within ±{fmt_metric(margin)} over {n}" for m, (_, margin, n) in also.items()) + ")"
    if target.met_within_noise(best):
        text += f"; {fmt_x(best['latency_speedup'])} is within its timing's {100 * best['noise']:.0f} % noise of the target"
    text += ")" if len(tied) <= 1 else ""
    apart = [p for p in within if p not in tied]
    if apart:
        lags = list(dict.fromkeys(m for p in apart for m in behind(p)))
        names = ", ".join(f"{_name(p)} ({fmt_metric(p['main'])})" for p in apart)
        one = len(apart) == 1
        text += (f"; {names} score{'s' if one else ''} within "
                 f"±{fmt_metric(noise)} of it on {md(main)} (its 95 % sampling interval over {top['dev_examples']} dev "
                 f"examples) but fall{'s' if one else ''} behind on " + ", ".join(f"{md(m)} by more than ±{fmt_metric(also[m][1])} over "
                                                             f"{also[m][2]}" for m in lags))
    rival = max((p for p in meeting if p not in within and p is not best), key=rank, default=None)
    if rival is not None:
        text += f"; it beats {_name(rival)} ({fmt_metric(rival['main'])}, {_speed_words(rival)})"
    better = max((p for p in scored if not target.met_by(p) and p["main"] > best["main"]),
                 key=lambda p: p["main"], default=None)
    if better is not None:
        text += (f", while the more accurate {md(better['point'], code=True)} ({fmt_metric(better['main'])}) "
                 f"misses the target ({_speed_words(better)})")
    if best.get("free"):
        text += ". No student trained here beats it: deploy the int8 teacher, which costs no training"
    return dict(best), text[0].upper() + text[1:] + "."


def point_record(p: Mapping[str, Any], target: Target, out: Path) -> dict[str, Any]:
    """A point as auto.json keeps it, with the folder its model is saved in (the free int8 teacher's is
    written only when it is chosen)."""
    if p.get("free"):
        saved = out / FREE_INT8
    else:
        folder = out / "candidates" / p["candidate"]
        saved = folder / "student" if p["model"] == "student" else folder / "exports" / p["model"]
    record = {"point": p["point"], "candidate": p["candidate"], "model": p["model"], "score": p["main"],
              "latency_ms": p["latency_ms"], "speedup": p["latency_speedup"], "meets_target": target.met_by(p),
              "within_noise": target.met_within_noise(p), "noise": p.get("noise"), "failed": p.get("failed"),
              "folder": str(saved)}
    if p.get("free"):
        record["measured_in"] = p["measured_in"]
    return record


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    with atomic_file(path, "w") as f:
        f.write(json.dumps(data, indent=2) + "\n")
