"""What ``--method auto`` knows of method prune (:class:`~distillery.method.AutoAsk`): how far it can go, its cost
and what it is expected to keep; it prunes to the target itself (its own latency model, measured here), and, where
the int8 export is faster than fp32 here, also to the lighter cut whose int8 export reaches the target."""

from __future__ import annotations

import math
from typing import Any

from distillery.autotinybert.convert import check_family
from distillery.distill.deep_cut import equivalent_layers
from distillery.errors import DistilleryError
from distillery.method import AutoAsk, expected_at

# The mode auto runs: cheap. The full mode starts from the cheap mode's selection and was 1.2 points of Pearson
# better on held-out STS-B train rows at 4×, at about nine times the time (its masks' phase): auto keeps the cheap
# one; a user's --option mode=full still wins.
MODE = "cheap"
# Training cost in passes of the teacher over the training data: the latency fit, the Fisher scores (a forward and
# backward over fisher_examples), then the fine-tuning of a smaller student.
COST = 2.5
# The share of the teacher's main metric the cheap mode kept, by one over the speed-up asked (distillery.auto_budget;
# benchmarks/results/prune-minilm-quick.json, seed 42): at 2×: STS-B 1.015, MRPC 1.001, RTE 0.976, SST-2 1.030
# (mean 1.006: no loss); fine-tuned by the deep-cut rule, at 4×: STS-B 1.017, MRPC 0.996, RTE 0.958, SST-2 1.005
# (before the rule: 1.001, 0.970, 0.904, 0.997); at 8×: STS-B 1.010, MRPC 0.992, RTE 0.952, SST-2 0.945 (before:
# 0.835, 0.954, 0.916, 0.944).
MEASURED_RETENTION = {1 / 8: 0.975, 1 / 4: 0.994, 1 / 2: 1.0, 1.0: 1.0}
# A pruned student's int8 export is not as much faster than its fp32 student as the teacher's architecture's
# (AutoAsk.int8_gain): its layers are narrower and unequal, and the embeddings' lookup, which int8 does not speed up,
# is a larger share of what is left. Measured at 1×128 (benchmarks/results/prune-minilm-quick.json, cheap mode,
# against the teacher architecture's 1.64-1.89 that auto timed on the same machine): at 2× it kept all of that gain
# (int8 1.73-1.93× its fp32 student), at 4× about half (1.33-1.53×), at 8× none (0.96-1.11×). The share kept is
# taken linear in log2 of the fp32 speed-up through those three: all up to 2×, none from 8×.
INT8_SHARE_ALL, INT8_SHARE_NONE = 2.0, 8.0
# The int8 export's expected speed-up is planned this far past the target: the fp32 speed-up measured against the
# one the latency model aimed at (the cheap mode's: 1.85-2.05× at 2×, 3.77-4.14× at 4×) and the int8 gain at a shape
# (1.33-1.53× at 4×) each scatter by about 7 %; on RTE at 4× (auto, benchmarks/results/auto-rte-4x.json) a cut planned
# at 2.95× with 5 % to spare measured 2.84× and its int8 export 3.77×, short of the target.
INT8_MARGIN = 1.10
# The lightest cut planned for its int8 export: below it the int8 export is about the free int8 teacher's, which
# auto measures beside every candidate anyway.
LIGHTEST = 1.2
# The furthest it is planned for: CoFi's largest published speed-up (12×); past it a layer keeps a head or two
# and the embeddings and head dominate the latency.
REACH = 12.0


def reach(ask: AutoAsk) -> float:
    check_family(ask.teacher_config)  # a sentence where the pruned student cannot hold this family
    return REACH


def int8_gain_at(speedup: float, teacher_gain: float) -> float:
    """How many times faster than its fp32 student the int8 export of a student pruned to ``speedup`` is expected
    to run, where the teacher's architecture's runs ``teacher_gain`` times faster (:data:`INT8_SHARE_ALL`)."""
    low, high = math.log2(INT8_SHARE_ALL), math.log2(INT8_SHARE_NONE)
    share = min(1.0, max(0.0, (high - math.log2(max(speedup, 1.0))) / (high - low)))
    return 1.0 + (max(teacher_gain, 1.0) - 1.0) * share


def int8_planned_speedup(target: float, teacher_gain: float) -> float | None:
    """The lightest cut from :data:`LIGHTEST` on (the smallest fp32 speed-up, to 0.01×) whose int8 export is
    expected to reach ``target`` with :data:`INT8_MARGIN` to spare (:func:`int8_gain_at`); None where only the target
    itself does (no lighter cut gains: the int8 export is no faster here, or the target is past where int8 gains)."""
    goal = target * INT8_MARGIN
    for hundredths in range(round(LIGHTEST * 100), math.ceil(target * 100)):
        speedup = hundredths / 100
        if speedup * int8_gain_at(speedup, teacher_gain) >= goal:
            return speedup
    return None


def candidates(ask: AutoAsk) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """One candidate pruned to the target speed-up (a latency asked for is one over the teacher's here), and, where
    a lighter cut's int8 export is expected to reach it (:func:`int8_planned_speedup`), one pruned to that cut: every
    candidate's int8 export is measured and may be the point chosen, and a lighter cut keeps more (on an embedder
    at 4×: the 4× cut kept 94.6 % of the teacher's STS-B Spearman, the 2× cut's int8 export 99.1 % at 3.4×)."""
    try:
        check_family(ask.teacher_config)
    except DistilleryError as e:
        return [], [{"name": "prune", "method": "prune", "reason": str(e)}]
    if ask.speedup > REACH:
        return [], [{"name": "prune", "method": "prune", "reason": f"{ask.speedup:.2f}× is past the {REACH:g}× it is "
                     "planned for"}]
    layers = int(getattr(ask.teacher_config, "num_hidden_layers", 0) or 0)

    def candidate(name: str, speedup: float, expected: float, why: str) -> dict[str, Any]:
        return {"name": name, "method": "prune", "options": {"mode": MODE, **ask.options, "speedup": speedup},
                "cost": COST, "why": "heads and neurons removed " + why + " by Fisher information per latency saved, "
                "on a latency model measured here (Kwon et al. 2022)", "expected": expected,
                # its fine-tuning is as deep a cut as a layer-drop student of its speed (the deep-cut rule's)
                "kept_layers": equivalent_layers(speedup, layers), "teacher_layers": layers}

    found = [candidate("prune", ask.speedup, expected_at(MEASURED_RETENTION, 1 / ask.speedup), "to the target")]
    lighter = int8_planned_speedup(ask.speedup, ask.int8_gain)
    if lighter is not None:
        int8 = lighter * int8_gain_at(lighter, ask.int8_gain)
        # expected to keep what its fp32 cut keeps: the cheap mode's int8 exports at 2× kept 1.000 of the teacher
        # (mean of the four tasks; 0.970 to 1.026), the 4× cut in fp32 0.994
        found.append(candidate(f"prune-{lighter:g}x", lighter, expected_at(MEASURED_RETENTION, 1 / lighter),
                                  f"to {lighter:.2f}× in fp32, so that its int8 export (about {int8:.2f}× here) "
                                  "reaches the target,"))
    return found, []
