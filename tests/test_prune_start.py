"""Method prune's full mode starts its masks' phase at the cheap mode's selection (issue 56): CoFi's start (every
log α 0) drew every gate at random and wrecked the weights in a short phase."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from distillery.prune.extract import full_size
from distillery.prune.fisher import fisher_masks
from distillery.prune.latency import LatencyModel
from distillery.prune.masks import Masks, calibrated_gates, fold, shape_of, start_at
from distillery.prune.options import PruneOptions
from distillery.prune.recipe import start_masks
from tests.helpers import tiny_teacher


def ones(masks: Masks) -> dict:
    return {name: torch.ones(masks.shapes[name]) for name in masks.names()}


def latency_of(model) -> LatencyModel:
    """A latency line of ``model``'s sizes, the whole model at 1 (heads and neurons priced about alike)."""
    c = model.config
    raw = LatencyModel([0.1, 0.05, 0.02, 0.02, 0.05, 2.0 / c.intermediate_size], full_hidden=c.hidden_size)
    whole = float(raw(shape_of(ones(Masks(c.num_hidden_layers, c.num_attention_heads, c.intermediate_size,
                                          c.hidden_size)), c.hidden_size)))
    return LatencyModel((raw.coefficients / whole).tolist(), full_hidden=c.hidden_size)


@pytest.mark.parametrize("layers, heads, ffn, hidden", [(3, 4, 37, 32), (12, 12, 3072, 768)])
def test_the_start_is_the_selection_its_far_units_well_inside_on_or_off(layers, heads, ffn, hidden):
    g = torch.Generator().manual_seed(0)
    cheap = Masks(layers, heads, ffn, hidden, prune_hidden=False)
    with torch.no_grad():  # a spread order as the cheap mode's (8 log α per unit of log score/cost); layer 1's heads last
        cheap.heads.copy_(torch.randn(layers * heads, generator=g) * 20 / cheap.lr_scale)
        cheap.neurons.copy_(torch.randn(layers * ffn, generator=g) * 20 / cheap.lr_scale)
        cheap.heads.view(layers, heads)[1] = -100 / cheap.lr_scale
        cheap.attention.fill_(100 / cheap.lr_scale)
        cheap.ffn.fill_(100 / cheap.lr_scale)
    price = lambda s: (s["heads"].sum() / (layers * heads) + s["neurons"].sum() / (layers * ffn)) / 2  # noqa: E731
    selection, shift = calibrated_gates(cheap, price, 0.3)
    assert selection["attention"][1] == 0 and 0 < selection["neurons"].sum() < layers * ffn
    order = {name: cheap.log_alpha(name).detach() + shift for name in ("heads", "neurons")}
    masks = start_at(Masks(layers, heads, ffn, hidden), selection, order, 6.0)
    start = fold(masks.gates("deterministic"))
    for name in selection:
        assert torch.equal(start[name], selection[name]), name
    assert bool(start["hidden"].all())
    p = {name: v.detach() for name, v in masks.gates("expected").items()}
    neurons, kept = order["neurons"], selection["neurons"] > 0
    threshold = (neurons[kept].min() + neurons[~kept].max()) / 2
    assert float(p["neurons"][neurons > threshold + 12].min()) > 0.99  # far from the threshold: on or off
    assert float(p["neurons"][neurons < threshold - 12].max()) < 0.01
    assert float(p["attention"][1]) < 0.01 < 0.99 < float(p["attention"][0])
    with torch.no_grad():
        assert abs(float(price(masks.expected_shape())) - float(price(shape_of(selection, hidden)))) < 0.005
        by_order = masks.log_alpha("neurons").gather(-1, torch.argsort(neurons, dim=-1))  # each row's Fisher order kept
        assert bool((by_order.diff(dim=-1) >= 0).all())


def cheap_context(model):
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(5, 99, (9,), generator=g), "attention_mask": torch.ones(9, dtype=torch.long),
             "labels": torch.tensor(i % 3)} for i in range(16)]

    def collate(batch):
        return {k: torch.stack([r[k] for r in batch]) for k in batch[0]}

    task_data = SimpleNamespace(train=rows, collate=collate, task=SimpleNamespace(kind_object="classification"))
    return SimpleNamespace(teacher=model, task_data=task_data, notes=[],
                           config=SimpleNamespace(student=SimpleNamespace(seed=0)))


def test_the_full_modes_masks_start_at_the_cheap_modes_selection():
    teacher = tiny_teacher(num_hidden_layers=3)
    full, _ = full_size(teacher)
    latency, ctx = latency_of(full), cheap_context(teacher)
    opts = PruneOptions(speedup=2.0, fisher_examples=16)
    selection, _ = calibrated_gates(fisher_masks(ctx, 16, full, latency), latency, 0.5)  # what mode=cheap removes
    assert 0 < selection["neurons"].sum() < selection["neurons"].numel()
    masks, start = start_masks(ctx, opts, full, latency)
    gates = fold(masks.gates("deterministic"))
    for name in selection:
        assert torch.equal(gates[name], selection[name]), name
    assert bool(gates["hidden"].all()) and start == 0.5  # the target held from the start: the selection meets it
    assert "started from the cheap mode's selection" in ctx.notes[-1]

    cofi, start = start_masks(ctx, PruneOptions(speedup=2.0, mask_init=0.0), full, latency)
    assert start == 1.0 and all(bool((cofi.log_alpha(n) == 0).all()) for n in cofi.names())


def test_a_head_floor_keeps_each_layers_best_heads_unless_nothing_else_reaches_the_target():
    teacher = tiny_teacher(num_hidden_layers=3)
    full, _ = full_size(teacher)
    latency, ctx = latency_of(full), cheap_context(teacher)
    heads = full.config.num_attention_heads
    deeper = []
    for target in (0.5, 0.3, 0.2):
        free, _ = calibrated_gates(fisher_masks(ctx, 16, full, latency), latency, target)
        floored, _ = calibrated_gates(fisher_masks(ctx, 16, full, latency, min_heads=heads - 1), latency, target)
        assert bool((floored["heads"].sum(-1) >= heads - 1).all()), target
        assert float(latency(shape_of(floored, full.config.hidden_size))) <= target
        deeper.append(bool((free["heads"].sum(-1) < heads - 1).any()))
    assert any(deeper)  # without the floor the selection cut heads deeper somewhere
    # a target only removing the floor's heads too can reach: reached, not refused
    none, _ = calibrated_gates(fisher_masks(ctx, 16, full, latency, min_heads=heads), latency, 0.05)
    assert float(latency(shape_of(none, full.config.hidden_size))) <= 0.05 or none["heads"].sum() == 0
