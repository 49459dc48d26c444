"""Method prune's cheap mode: Fisher information of the units' masks, ranked per latency saved, cut to the target."""

from __future__ import annotations

import json

import pytest
import torch
from torch.testing import assert_close

import distillery
from distillery.prune.fisher import priority, unit_costs
from distillery.prune.latency import LatencyModel
from tests.helpers import prune_twice


def test_fisher_scores_are_the_squares_of_the_per_example_terms(tiny_bert):
    """With one example a batch, Σ|t| and Σt² of the same per-example terms t: Fisher ≤ (Σ|t|)², equal for one example."""
    from transformers import AutoModelForSequenceClassification

    from distillery.importance import unit_importance

    model = AutoModelForSequenceClassification.from_pretrained(str(tiny_bert), trust_remote_code=False)
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(5, 99, (9,), generator=g), "attention_mask": torch.ones(9, dtype=torch.long),
             "labels": torch.tensor(i % 2)} for i in range(1)]

    def collate(batch):
        return {k: torch.stack([r[k] for r in batch]) for k in batch[0]}

    n_abs, h_abs = unit_importance(model, rows, collate, "classification", batch_size=1, progress=False)
    n_sq, h_sq = unit_importance(model, rows, collate, "classification", batch_size=1, progress=False, fisher=True)
    assert_close(n_sq, n_abs ** 2, rtol=1e-4, atol=1e-12)
    assert_close(h_sq, h_abs ** 2, rtol=1e-4, atol=1e-12)


def test_units_rank_by_score_per_latency_saved():
    latency = LatencyModel([0.1, 0.02, 0.01, 0.002, 0.03, 0.0001], full_hidden=32)
    head, neuron = unit_costs(latency)
    assert abs(head - 0.012) < 1e-8 and abs(neuron - 0.0001) < 1e-8
    # a head 100 times as important as a neuron but costing 120 times as much ranks below it
    assert priority(torch.tensor([100.0]), head) < priority(torch.tensor([1.0]), neuron)


def test_compress_prune_cheap_meets_the_target_and_is_the_same_twice(tiny_bert, tmp_path, monkeypatch):
    runs = prune_twice(tiny_bert, tmp_path, monkeypatch, mode="cheap", fisher_examples=16, latency_shapes=8,
                       latency_runs=1, speedup=2.0)
    for out in runs:
        shape = json.loads((out / "pruned_shape.json").read_text())
        assert shape["mode"] == "cheap" and shape["predicted_ratio"] <= 0.5
        report = (out / "report.md").read_text()
        assert "Cheap mode" in report and "Timed here before fine-tuning" in report
        assert json.loads((out / "selection.json").read_text())["rounds"]  # the selection, timed with the teacher
    students = [distillery.load_student(out).state_dict() for out in runs]
    assert students[0].keys() == students[1].keys()
    assert all(torch.equal(students[0][k], students[1][k]) for k in students[0])


def test_auto_runs_the_cheap_mode_unless_a_mode_is_given():
    from distillery.method import AutoAsk
    from distillery.prune.auto import candidates
    from tests.helpers import tiny_bert_config

    ask = lambda options: AutoAsk(tiny_bert_config(), 4.0, 128, options)  # noqa: E731
    assert candidates(ask({}))[0][0]["options"] == {"mode": "cheap", "speedup": 4.0}
    assert candidates(ask({"mode": "full"}))[0][0]["options"]["mode"] == "full"


def test_a_selection_timed_off_the_target_is_selected_again_and_read_back_on_resume(tmp_path, monkeypatch):
    """The latency model is a fitted line: where the shape it selects times (with the teacher, here) further than the
    tolerance from the target, the selection is made again at the target scaled by the error, and the timings are
    kept in selection.json, from which a resumed run takes the same gates without timing anything."""
    from types import SimpleNamespace

    from distillery.prune import recipe
    from distillery.prune.masks import Masks, shape_of

    torch.manual_seed(0)
    masks = Masks(2, 4, 64, 8, prune_hidden=False)
    with torch.no_grad():  # units ranked at random, every sub-layer kept
        masks.heads.normal_(0.0, 0.2)
        masks.neurons.normal_(0.0, 0.2)
        masks.attention.fill_(10.0)
        masks.ffn.fill_(10.0)
    latency = LatencyModel([0.1, 0.05, 0.02, 0.01, 0.05, 0.0008], full_hidden=8)
    timed = []

    def slow_by_a_quarter(full, shapes, teacher, runs):  # the model underprices every shape by 25 %
        timed.append(shapes[0])
        return [1.25 * float(latency(shapes[0]))], 10.0, [{"stable": True}]

    monkeypatch.setattr(recipe, "measure_ratios", slow_by_a_quarter)
    ctx = SimpleNamespace(out_dir=tmp_path, teacher=None)
    opts = SimpleNamespace(speedup=2.0, latency_runs=1)
    full = SimpleNamespace(config=SimpleNamespace(hidden_size=8))
    gates, shift, record = recipe.timed_selection(ctx, opts, masks, latency, full)
    rounds = record["rounds"]
    assert len(rounds) >= 2 and rounds[0]["measured_ratio"] > 0.5 * (1 + recipe.SELECTION_TOLERANCE)
    # the target over the model's error on the shape timed (25 % slow, whatever the shape)
    assert rounds[1]["asked_ratio"] == pytest.approx(0.5 / 1.25)
    kept = rounds[record["chosen"]]["measured_ratio"]
    assert abs(kept - 0.5) < abs(rounds[0]["measured_ratio"] - 0.5)
    assert float(latency(shape_of(gates, 8))) <= rounds[record["chosen"]]["asked_ratio"]
    assert "selected again" in recipe.selection_note(record)
    # resumed: read back, nothing timed, the same gates
    monkeypatch.setattr(recipe, "measure_ratios", lambda *a, **k: pytest.fail("timed again on resume"))
    again, again_shift, _ = recipe.timed_selection(ctx, opts, masks, latency, full)
    assert again_shift == shift and all(torch.equal(again[k], gates[k]) for k in gates)
    assert json.loads((tmp_path / "selection.json").read_text()) == record
