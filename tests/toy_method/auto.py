"""What ``--method auto`` knows of the toy method: keeping one layer at best, one candidate."""

from __future__ import annotations

from distillery.method import AutoAsk


def reach(ask: AutoAsk) -> float:
    return float(ask.teacher_config.num_hidden_layers)


def candidates(ask: AutoAsk):
    return [{"name": "toy", "method": "toy", "options": {**ask.options, "keep_layers": 1}, "cost": 0.1,
             "why": "the teacher's first layer", "expected": 0.5}], []
