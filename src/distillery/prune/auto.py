"""What ``--method auto`` knows of method prune (:class:`~distillery.method.AutoAsk`): how far it can go, its cost
and what it is expected to keep; it prunes to the target itself (its own latency model, measured here), and, where
the int8 export is faster than fp32 here, also to the lighter cut whose int8 export reaches the target."""

from __future__ import annotations

from typing import Any

from distillery.autotinybert.convert import check_family
from distillery.distill.deep_cut import equivalent_layers
from distillery.errors import DistilleryError
from distillery.method import AutoAsk, expected_at, lightest_int8_cut, narrowed_int8_gain

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
# The furthest it is planned for: CoFi's largest published speed-up (12×); past it a layer keeps a head or two
# and the embeddings and head dominate the latency.
REACH = 12.0


def reach(ask: AutoAsk) -> float:
    check_family(ask.teacher_config)  # a sentence where the pruned student cannot hold this family
    return REACH


def candidates(ask: AutoAsk) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """One candidate pruned to the target speed-up (a latency asked for is one over the teacher's here), and, where
    a lighter cut's int8 export is expected to reach it (:func:`~distillery.method.lightest_int8_cut`), one pruned
    to that cut: every candidate's int8 export is measured and may be the point chosen, and a lighter cut keeps more
    (on an embedder at 4×: the 4× cut kept 94.6 % of the teacher's STS-B Spearman, the 2× cut's int8 export 99.1 %
    at 3.4×)."""
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
    lighter = lightest_int8_cut(ask.speedup, ask.int8_gain)
    if lighter is not None:
        int8 = lighter * narrowed_int8_gain(lighter, ask.int8_gain)
        # expected to keep what its fp32 cut keeps: the cheap mode's int8 exports at 2× kept 1.000 of the teacher
        # (mean of the four tasks; 0.970 to 1.026), the 4× cut in fp32 0.994
        found.append(candidate(f"prune-{lighter:g}x", lighter, expected_at(MEASURED_RETENTION, 1 / lighter),
                                  f"to {lighter:.2f}× in fp32, so that its int8 export (about {int8:.2f}× here) "
                                  "reaches the target,"))
    return found, []
