"""The base-size sitting's acceptance lines (benchmarks/base.py): each check of the issues against the quality
records and the speed benches, as the Markdown bullets docs/results.md shows under the table."""

from __future__ import annotations

import math
import re

from common import FOUR_X_SPEEDUP, four_x_point as best_four_x


def at_two_threads(benches: list[dict]) -> dict | None:
    """The bench measured at 2 threads (every core here), None without one."""
    return next((b for b in benches if b["hardware"]["threads"] == 2), None)


def int8_key(bench: dict, name: str) -> str | None:
    """The key of ``name``'s int8 export among a bench's speed-ups (``distill-onnx-int8``), None without one."""
    return next((k for k in bench["speedups"] if re.fullmatch(rf"{re.escape(name)}-[a-z]+-int8", k)), None)


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def speed_checks(benches: dict[int, dict]) -> list[str]:
    """The issue's speed acceptance, measured at 2 threads (every core here)."""
    b = benches.get(2) or next(iter(benches.values()))
    lines, s = [], b["speedups"]
    if "moebert" in s and "no-routing bound" in s:
        share = s["moebert"]["latency"] / s["no-routing bound"]["latency"]
        tp = s["moebert"]["throughput"] / s["no-routing bound"]["throughput"]
        met = [shape for shape, share_at in (("1×128", share), ("256×64", tp)) if share_at >= 0.95]
        lines.append(f"- MoEBERT reaches {share:.3f} of its no-routing bound at 1×128 ({tp:.3f} at 256×64); "
                     f"FLOP-ideal {s['moebert']['flop_ideal_latency']:.2f}× against the bound's "
                     f"{s['no-routing bound']['flop_ideal_latency']:.2f}× (≥ 0.95 asked: {_verdict(min(share, tp) >= 0.95)}"
                     f"{'; met at ' + met[0] + ' only' if len(met) == 1 else ''}).")
    for k in (2, 4, 8):
        name = f"autotinybert-{k}x"
        if name in s:
            off = s[name]["latency"] / k - 1
            lines.append(f"- AutoTinyBERT {k}× budget: measured {s[name]['latency']:.2f}× "
                         f"({100 * off:+.1f} % of the budget; within 10 %: {_verdict(abs(off) <= 0.10)}).")
    if "cmow" in s:
        lines.append(f"- CMOW throughput: {s['cmow']['throughput']:.0f}× the teacher at 256×64 "
                     f"(≥ 300× asked: {_verdict(s['cmow']['throughput'] >= 300)}).")
    return lines


def int8_accuracy(name: str, quality: list[dict], benches: list[dict]) -> float | None:
    """The int8 export's SST-2 dev accuracy: scored by the speed phase (this code's export), else by the
    quality run's own ``--export int8``."""
    for bench in benches:
        if name in bench.get("int8_scores", {}):
            return bench["int8_scores"][name]["accuracy"]
    rows = {r["method"]: r for r in quality}
    row = rows.get(name) or (next(iter(rows.values()), None) if name == "teacher" else None)
    if row is None:
        return None
    who = "teacher" if name == "teacher" else "student"
    q8 = row["others"].get(f"{who}-torch-int8") or row["others"].get(f"{who}-onnx-int8")
    return q8["accuracy"] if q8 else None


# The layer-drop students (distill, teacher layers spread evenly) by their layer count: the line each searched
# AutoTinyBERT student must stay on or above, at its own measured speed.
LAYER_DROP = {"distill": 6, "distill-3layers": 3, "distill-2layers": 2, "distill-1layer": 1}
SAME_SPEED = 1.05  # two speed-ups within 5 % of each other are one speed (run-to-run spread of the 1×128 timing)
MAJORITY_SST2_DEV = 444 / 872  # the larger class of SST-2 dev: a student at it has learned nothing


def layer_drop_at(speed: float, points: list[tuple[float, float, str]]) -> tuple[float, str] | None:
    """The layer-drop students' accuracy at ``speed``: interpolated in log speed between the two measured around
    it (``points``: speed-up, accuracy, name), or None outside their range."""
    points = sorted(points)
    for (s0, a0, n0), (s1, a1, n1) in zip(points, points[1:]):
        if s0 <= speed <= s1:
            w = math.log(speed / s0) / math.log(s1 / s0)
            return a0 + w * (a1 - a0), f"{n0} {a0:.4f} at {s0:.2f}×, {n1} {a1:.4f} at {s1:.2f}×"
    # just past the line's end: that student is of the same speed, within the timings' noise
    if not points:
        return None
    s0, a0, n0 = min(points, key=lambda p: abs(math.log(speed / p[0])))
    return (a0, f"{n0} {a0:.4f} at {s0:.2f}×") if abs(math.log(speed / s0)) <= math.log(SAME_SPEED) else None


def searched_against_layer_drop(acc: dict[str, float], benches: list[dict]) -> list[str]:
    """Each AutoTinyBERT k× student against the layer-drop line at its measured latency speed-up (2 threads)."""
    two = at_two_threads(benches)
    if two is None:  # no speed measured with these runs (the GPU rows): the 4× budget's layer-drop student
        if "autotinybert-4x" not in acc or "distill-3layers" not in acc:
            return []
        a, d = acc["autotinybert-4x"], acc["distill-3layers"]
        return [f"- AutoTinyBERT 4× {a:.4f} against the layer-drop student of its speed (distill-3layers) "
                f"{d:.4f}: {100 * (a - d):+.1f} points."]
    speed = lambda name: (two["speedups"].get(name) or {}).get("latency")  # noqa: E731
    points = [(speed(n), acc[n], n) for n in LAYER_DROP if n in acc and speed(n)]
    lines = []
    for k in (2, 4, 8):
        name = f"autotinybert-{k}x"
        if name not in acc or not speed(name):
            continue
        a, at = acc[name], layer_drop_at(speed(name), points)
        chance = f"above the majority class {MAJORITY_SST2_DEV:.3f}: {_verdict(a > MAJORITY_SST2_DEV + 0.02)}"
        if at is None:
            lines.append(f"- AutoTinyBERT {k}× {a:.4f} at {speed(name):.2f}×: no layer-drop students measured around "
                         f"that speed; {chance}.")
            continue
        line, around = at
        lines.append(f"- AutoTinyBERT {k}× {a:.4f} at {speed(name):.2f}× against the layer-drop line at that speed "
                     f"{line:.4f} ({around}): {100 * (a - line):+.1f} points (≥ asked: {_verdict(a >= line)}); {chance}.")
    return lines


def quality_checks(quality: list[dict], benches: list[dict], own_tokenizer: tuple[str, ...] = ()) -> list[str]:
    """The issue's quality acceptance on SST-2 dev, from the quality runs (and the speed phase's int8 scores)."""
    rows = {r["method"]: r for r in quality}
    if not rows:
        return []
    teacher = next(iter(rows.values()))["metrics"]["teacher"]["accuracy"]
    acc = {"teacher": teacher, **{k: r["metrics"]["student"]["accuracy"] for k, r in rows.items()}}
    lines = []
    if "autotinybert-4x" in acc and "distill" in acc:
        a, d = acc["autotinybert-4x"], acc["distill"]
        lines.append(f"- AutoTinyBERT 4× {a:.4f} against distill {d:.4f} (≥ asked: {_verdict(a >= d)}) and "
                     f"{100 * (teacher - a):.1f} points under the teacher {teacher:.4f} (≤ 1.5 asked: "
                     f"{_verdict(teacher - a <= 0.015)}).")
    lines += searched_against_layer_drop(acc, benches)
    if "distill-3layers-augment" in acc and "distill-3layers" in acc:
        a, d = acc["distill-3layers-augment"], acc["distill-3layers"]
        lines.append(f"- The 4× layer-drop student with TinyBERT's augmentation (2 new sentences per original, labelled by "
                     f"the teacher): {a:.4f} against {d:.4f} without, {100 * (teacher - a):.1f} points under the teacher "
                     f"(within 2 asked: {_verdict(teacher - a <= 0.02)}).")
    own = [k for k in own_tokenizer if k in acc]
    if own:
        fours = ", ".join(f"{k} {acc[k]:.4f}" for k in ("distill-3layers", "autotinybert-4x") if k in acc)
        lines.append("- The pretrained MiniLM as student (its own tokenizer): " + ", ".join(
            f"{k} {acc[k]:.4f} ({100 * (teacher - acc[k]):.1f} points under the teacher)" for k in own)
            + (f"; distillery's own 4× students: {fours}." if fours else "."))
    if "moebert" in acc:
        lines.append(f"- MoEBERT {acc['moebert']:.4f}: {100 * (teacher - acc['moebert']):.1f} points under the teacher "
                     f"(≤ 1 asked: {_verdict(teacher - acc['moebert'] <= 0.01)}).")
    int8 = {k: int8_accuracy(k, quality, benches) for k in acc}
    gaps = {k: int8[k] - a for k, a in acc.items() if int8[k] is not None}
    if gaps:
        worst = max(gaps.values(), key=abs)
        lines.append("- int8 exports against their fp32 rows: " + ", ".join(f"{k} {100 * g:+.1f}" for k, g in gaps.items())
                     + f" points (within 1 asked: {_verdict(abs(worst) <= 0.01)}).")
    return lines + four_x_point(acc, int8, benches)


def four_x_point(acc: dict[str, float], int8: dict[str, float | None], benches: list[dict]) -> list[str]:
    """Issue 39's base-size 4× student, as augment.py's 4× point: the most accurate student or int8 export measured
    at least FOUR_X_SPEEDUP× faster than the teacher at 1×128 (2 threads), against the teacher's score."""
    two = at_two_threads(benches)
    if two is None or "teacher" not in acc:
        return []
    points = []
    for name in sorted(acc.keys() - {"teacher"}):
        q8 = int8_key(two, name)
        points.append({"model": name, "score": acc[name], "speedup": (two["speedups"].get(name) or {}).get("latency")})
        if q8 and int8.get(name) is not None:
            points.append({"model": f"{name} int8", "score": int8[name], "speedup": two["speedups"][q8]["latency"]})
    best = best_four_x(points)
    if best is None:
        return []
    gap = acc["teacher"] - best["score"]
    return [f"- The 4× point (the most accurate student or int8 export measured at ≥ {FOUR_X_SPEEDUP}×): {best['model']} "
            f"{best['score']:.4f} at {best['speedup']:.2f}×, {100 * gap:.1f} points under the teacher "
            f"(within 2 asked: {_verdict(gap <= 0.02)})."]


def longer_lines(quality: list[dict], variants: dict) -> list[str]:
    """One line per longer training among ``quality`` (a label of ``variants`` with settings of its own)."""
    teacher = quality[0]["metrics"]["teacher"]["accuracy"] if quality else None
    lines = []
    for r in quality:
        row, settings = variants.get(r["method"], (None, {}))
        if settings:
            gap = teacher - r["metrics"]["student"]["accuracy"]
            verdict = f" (MoEBERT ≤ 1 asked: {_verdict(gap <= 0.01)})" if row == "moebert" else ""
            lines.append(f"- Longer training: {r['method']} {r['metrics']['student']['accuracy']:.4f}, "
                         f"{100 * gap:.2f} points under the teacher{verdict}.")
    return lines
