"""What ``--method auto`` knows of AutoTinyBERT (:class:`~distillery.method.AutoAsk`): its FLOP-ideal speed-up
on a teacher, its cost and what it is expected to keep, and that it searches under the target itself and, where the
int8 export is faster than fp32 here, also under the lighter budget whose sub-network's int8 export reaches it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from distillery.autotinybert.space import SearchSpace
from distillery.method import AutoAsk, expected_at, lightest_int8_cut, method_options, narrowed_int8_gain

# Training cost in passes of the teacher over the training data: a one-shot super-net (several sub-networks a
# step), the latency fit, the search, then further training: the dearest by far.
COST = 8.0
# The same from a super-net another candidate of the run trained (no one-shot phase): SST-2 at the quick budget took
# 1,264 s with its one-shot phase (2×) and 522 s from that super-net (4×)
# (benchmarks/results/autotinybert-{2,4}-quick.json).
COST_FROM_SUPERNET = 3.5
# The share of the teacher's main metric it kept, by one over the speed-up it searched under (distillery.auto_budget):
# at 2×: SST-2 1.020, MRPC 1.011, RTE 0.873, STS-B 0.998; at 4×: SST-2 1.005, MRPC 0.951, RTE 0.880, STS-B 0.922
# (benchmarks/results/autotinybert-{2,4}-quick.json, seed 42).
MEASURED_RETENTION = {1 / 4: 0.940, 1 / 2: 0.976, 1.0: 1.0}
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
    """One candidate searched under the target (the latency asked for, else the speed-up), and, where a lighter
    sub-network's int8 export is expected to reach it (:func:`~distillery.method.lightest_int8_cut`), one searched
    under that lighter budget: every candidate's int8 export is measured and may be the point chosen, and a lighter
    sub-network keeps more (at 2× it kept 0.976 of the teacher, at 4× 0.940)."""
    def candidate(name: str, speedup: float, why: str) -> dict[str, Any]:
        # a latency target is one over the teacher's latency here: a lighter budget is that latency times the ratio
        target = ({"budget_ms": ask.latency_ms * ask.speedup / speedup} if ask.latency_ms is not None
                  else {"speedup": speedup})
        return {"name": name, "method": "autotinybert", "options": {**ask.options, **target}, "cost": COST,
                "why": why, "expected": expected_at(MEASURED_RETENTION, 1 / speedup)}

    found = [candidate("autotinybert", ask.speedup, "a sub-network searched under the latency budget on this machine")]
    lighter = lightest_int8_cut(ask.speedup, ask.int8_gain)
    if lighter is not None:
        int8 = lighter * narrowed_int8_gain(lighter, ask.int8_gain)
        found.append(candidate(f"autotinybert-{lighter:g}x", lighter,
                               f"a sub-network searched under {lighter:.2f}× on this machine, so that its int8 export "
                               f"(about {int8:.2f}× here) reaches the target"))
    return found, []


def reuse(options: Mapping[str, Any], siblings: Sequence[Path]) -> tuple[dict[str, Any], float, str] | None:
    """What a candidate can start from that another AutoTinyBERT candidate of the same auto run left (``siblings``:
    their folders): the super-net its one-shot phase saved (the one-shot phase does not depend on the budget
    searched under), as its ``supernet`` option, with its cost from there and the words; None where none saved one, or
    where the user gave a super-net."""
    if options.get("supernet"):
        return None
    for folder in siblings:
        if (folder / "supernet" / "supernet.json").is_file():
            return ({"supernet": str(folder / "supernet")}, COST_FROM_SUPERNET,
                    f"from the super-net of candidate {folder.name} (no one-shot phase)")
    return None
