"""What ``--method auto`` knows of AutoTinyBERT (:class:`~distillery.method.AutoAsk`): its FLOP-ideal speed-up
on a teacher, its cost and what it is expected to keep, and that it searches under the target itself."""

from __future__ import annotations

from typing import Any

from distillery.autotinybert.space import SearchSpace
from distillery.method import AutoAsk, method_options

# Training cost in passes of the teacher over the training data: a one-shot super-net (several sub-networks a
# step), the latency fit, the search, then further training: the dearest by far.
COST = 8.0
# The share of the teacher's main metric it is expected to keep (distillery.auto_budget says how these compare
# across methods).
EXPECTED = 0.97
PLANNED = ("budget_ms",)  # set from the target: auto refuses it given


def reach(ask: AutoAsk) -> float:
    """The teacher's encoder multiply-adds a token over those of the smallest sub-network of its search space."""
    from distillery.autotinybert.latency import arch_flops
    from distillery.encoders import encoder_flops, ffn_width, layout_of

    config = ask.teacher_config
    atb = method_options("autotinybert").read(ask.options)
    smallest = SearchSpace.from_supernet(int(config.num_hidden_layers), int(config.hidden_size),
                                         ffn_width(layout_of(config), config), int(config.num_attention_heads),
                                         atb.strategy).smallest()
    return encoder_flops(config, ask.seq) / arch_flops(smallest, ask.seq)


def candidates(ask: AutoAsk) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """One candidate, its search held to the target: the latency asked for, else the speed-up."""
    target = {"budget_ms": ask.latency_ms} if ask.latency_ms is not None else {"speedup": ask.speedup}
    return [{"name": "autotinybert", "method": "autotinybert", "options": {**ask.options, **target}, "cost": COST,
             "why": "a sub-network searched under the latency budget on this machine", "expected": EXPECTED}], []
