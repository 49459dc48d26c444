"""What ``--method auto`` knows of CMOW (:class:`~distillery.method.AutoAsk`): its FLOP-ideal speed-up on a
teacher, its cost and what it is expected to keep."""

from __future__ import annotations

from typing import Any

from distillery.method import AutoAsk, method_options

# Training cost in passes of the teacher over the training data: the teacher labels the whole train split once;
# the student is a fraction of a layer.
COST = 1.5
# The share of the teacher's main metric it kept (distillery.auto_budget), with no attention the least, at 14-28×:
# SST-2 0.969, MRPC 0.980, RTE 0.939, STS-B 0.745 (benchmarks/results/cmow-quick.json).
EXPECTED = 0.908


def reach(ask: AutoAsk) -> float:
    """The teacher's encoder multiply-adds a token over CMOW's: one d×d matrix product a token and direction."""
    from distillery.encoders import encoder_flops

    cmow = method_options("cmow").read(ask.options)
    return encoder_flops(ask.teacher_config, ask.seq) / (int(cmow.matrix_dim) ** 3 * (2 if cmow.bidirectional else 1))


def candidates(ask: AutoAsk) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    return [{"name": "cmow", "method": "cmow", "options": dict(ask.options), "cost": COST,
             "why": "no attention: its speed does not depend on the teacher's depth", "expected": EXPECTED}], []
