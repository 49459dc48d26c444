"""What ``--method auto`` knows of method static (:class:`~distillery.method.AutoAsk`): its FLOP-ideal speed-up on a
teacher, its cost and what it is expected to keep, and when it is planned: only for a target beyond what a
transformer student of the teacher is planned to reach. Only an embedding teacher gets here (the recipe's
``unhandled_kinds`` holds every other kind, and auto plans no method for a kind it does not handle)."""

from __future__ import annotations

from typing import Any

from distillery.encoders import encoder_flops
from distillery.method import AutoAsk, method_options

# Training cost in passes of the teacher over the training data: the teacher's vectors of the text, once (cached),
# and of each vocabulary token as a one-token sentence; the table's training is seconds.
COST = 1.0
# The share of the teacher's main metric it is expected to keep (distillery.auto_budget says how these compare across
# methods): the fine-tuned table kept 0.806 of the built-in teacher's 0.867 STS-B Spearman (93 %, docs/static.md).
EXPECTED = 0.93


def reach(ask: AutoAsk) -> float:
    """The teacher's encoder multiply-adds a token over the static embedder's: one addition a vector number."""
    width = method_options("static").read(ask.options).pca_dims or int(ask.teacher_config.hidden_size)
    return encoder_flops(ask.teacher_config, ask.seq) / width


def transformer_reach(ask: AutoAsk) -> float:
    """The furthest a transformer student is planned to reach: one of the teacher's layers, its int8 export at the
    int8 speed-up measured here (a searched AutoTinyBERT sub-network's FLOP-ideal bound goes further, but its
    embeddings, its tokenization and the calls' overhead, which no smaller encoder removes, keep it from the bound)."""
    return float(ask.teacher_config.num_hidden_layers) * max(1.0, ask.int8_gain)


def candidates(ask: AutoAsk) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """One candidate where the target is beyond :func:`transformer_reach`, else none, with the reason."""
    bound = transformer_reach(ask)
    if ask.speedup <= bound:
        return [], [{"name": "static", "method": "static", "reason": f"a transformer student can reach "
                     f"{ask.speedup:.2f}× (one layer of the teacher's {ask.teacher_config.num_hidden_layers}, with its "
                     f"int8 export: {bound:.2f}×), so the less accurate static table is not planned"}]
    return [{"name": "static", "method": "static", "options": dict(ask.options), "cost": COST, "exports": False,
             "why": f"static token vectors (FLOP-ideal {reach(ask):.0f}×): the target is beyond a transformer "
                    f"student's {bound:.2f}×", "expected": EXPECTED}], []
