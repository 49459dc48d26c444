"""What ``--method auto`` knows of method prune (:class:`~distillery.method.AutoAsk`): how far it can go, its cost
and what it is expected to keep; it prunes to the target itself (its own latency model, measured here)."""

from __future__ import annotations

from typing import Any

from distillery.autotinybert.convert import check_family
from distillery.errors import DistilleryError
from distillery.method import AutoAsk

# Training cost in passes of the teacher over the training data: the latency fit, the masks' phase (the teacher
# and the full-size masked student each step: mask_steps of the quick budget are about one pass over 20k
# examples), then the fine-tuning of a smaller student.
COST = 4.0
# Unmeasured here yet (benchmarks/prune.py will): CoFi keeps 99.7 % of BERT-base on SST-2 at 2.1× and 97 % at
# 12×, from epochs of pruning a quick budget does not give; set below AutoTinyBERT's measured 0.97 until measured.
EXPECTED = 0.96
# The furthest it is planned for: CoFi's largest published speed-up (12×); past it a layer keeps a head or two
# and the embeddings and head dominate the latency.
REACH = 12.0


def reach(ask: AutoAsk) -> float:
    check_family(ask.teacher_config)  # a sentence where the pruned student cannot hold this family
    return REACH


def candidates(ask: AutoAsk) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """One candidate, pruned to the target speed-up (a latency asked for is one over the teacher's here)."""
    try:
        check_family(ask.teacher_config)
    except DistilleryError as e:
        return [], [{"name": "prune", "method": "prune", "reason": str(e)}]
    if ask.speedup > REACH:
        return [], [{"name": "prune", "method": "prune", "reason": f"{ask.speedup:.2f}× is past the {REACH:g}× it is "
                     "planned for"}]
    return [{"name": "prune", "method": "prune", "options": {**ask.options, "speedup": ask.speedup}, "cost": COST,
             "why": "heads, neurons, hidden width and sub-layers removed to the target by a latency model measured "
                    "here (CoFi)", "expected": EXPECTED}], []
