"""What ``--method auto`` knows of MoEBERT (:class:`~distillery.method.AutoAsk`): its FLOP-ideal speed-up on a
teacher, its cost and what it is expected to keep; it is planned where its student or that student's int8 export is
expected to reach the target."""

from __future__ import annotations

from typing import Any, Mapping

from distillery.errors import DistilleryError
from distillery.method import AutoAsk, method_options

# Training cost in passes of the teacher over the training data: distill's, plus an importance pass, with a
# student nearly the teacher's size.
COST = 5.0
# The share of the teacher's main metric it kept (distillery.auto_budget) at 1.6×, its 4 experts' reach: SST-2 0.995,
# MRPC 1.004, RTE 0.976, STS-B 1.013 (benchmarks/results/moebert-quick.json).
EXPECTED = 0.997
# The share of the int8 gain measured here on the teacher's architecture (AutoAsk.int8_gain) that a MoEBERT student's
# int8 export keeps over its fp32 student: its experts are narrower matrices run per token group, and the embeddings
# and attention are the teacher's. At 1×128, random weights of the built-in teacher's architecture, one thread
# (`python benchmarks/moebert.py --only int8`, benchmarks/results/moebert-int8.json): 4 experts 0.62-0.75, 2 experts
# 0.67-0.79 (int8 2.2-2.4× its student, the teacher's 2.7-3.1×); a MoEBERT embedder of the built-in teacher kept 0.23
# (int8 2.26× over the teacher at 1.73× in fp32, the teacher's int8 copy 2.37×; embedding-minilm.json).
INT8_SHARE = 0.5


def speedup_bound(teacher_config, seq: int, given: Mapping[str, Any]) -> tuple[float, str]:
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


def reach(ask: AutoAsk) -> float:
    return speedup_bound(ask.teacher_config, ask.seq, ask.options)[0]


def int8_reach(bound: float, teacher_gain: float) -> float:
    """The FLOP-ideal speed-up ``bound`` times what its int8 export is expected to add (:data:`INT8_SHARE`)."""
    return bound * (1.0 + (max(teacher_gain, 1.0) - 1.0) * INT8_SHARE)


def candidates(ask: AutoAsk) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """MoEBERT at its options, where its FLOP-ideal speed-up, or its int8 export's expected one, reaches the
    target: every candidate's int8 export is measured and may be the point chosen."""
    try:
        bound, how = speedup_bound(ask.teacher_config, ask.seq, ask.options)
    except DistilleryError as e:
        return [], [{"name": "moebert", "method": "moebert", "reason": str(e)}]
    int8 = int8_reach(bound, ask.int8_gain)
    if ask.speedup > int8:
        also = f", its int8 export's about {int8:.2f}× here," if int8 > bound else ""
        return [], [{"name": "moebert", "method": "moebert", "reason": f"its FLOP-ideal speed-up is at most {how}"
                     f"{also} below the {ask.speedup:.2f}× needed"}]
    why = f"FLOP-ideal speed-up {how}"
    if ask.speedup > bound:
        why += f"; its int8 export about {int8:.2f}× here"
    return [{"name": "moebert", "method": "moebert", "options": dict(ask.options), "cost": COST,
             "why": why, "expected": EXPECTED}], []
