"""Method prune's latency model on synthetic timings (nothing is timed here): the fit as a ratio to the teacher's
latency, its cross-validated error, and the rounds taken while the noise check says unstable."""

from __future__ import annotations

import random

import pytest
import torch

from distillery.prune import latency
from distillery.prune.extract import full_size
from distillery.prune.latency import LatencyModel, features, fit_error, fit_latency_model, random_shape
from tests.helpers import tiny_teacher

TRUE = torch.tensor([0.01, 0.02, 0.004, 0.001, 0.03, 0.0005])  # a ratio per unit of each feature


def synthetic(count=24, noise=0.0, seed=0):
    full, _ = full_size(tiny_teacher(num_hidden_layers=3))
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    shapes = [random_shape(full.config, rng) for _ in range(count)]
    ratios = [float(features(s, full.config.hidden_size) @ TRUE) * (1 + noise * float(torch.randn((), generator=g)))
              for s in shapes]
    return full, shapes, ratios


def test_the_fit_recovers_a_line_of_ratios():
    full, shapes, ratios = synthetic()
    model = LatencyModel.fit(shapes, ratios, full.config.hidden_size)
    for s, r in zip(shapes, ratios):
        assert float(model(s)) == pytest.approx(r, rel=1e-4)
    assert fit_error(shapes, ratios, full.config.hidden_size) < 1e-3
    assert model.state()["predicts"] == "latency / the teacher's latency"


def test_the_fit_error_grows_with_the_noise_of_the_timings():
    errors = [fit_error(s, r, f.config.hidden_size) for f, s, r in (synthetic(noise=n) for n in (0.0, 0.05, 0.2))]
    assert errors[0] < errors[1] < errors[2]
    assert 1.0 < errors[1] < 15.0


def fake_timing(teacher_ms, stable):
    """checked_latency_ms as a machine whose speed changes each round (the teacher's latency read from
    ``teacher_ms`` in turn) while every model keeps its ratio to the teacher: parameter count / the teacher's."""
    calls = []

    def timing(models, **_):
        scale = teacher_ms[len(calls)] / sum(p.numel() for p in models["teacher"].parameters())
        calls.append(set(models))
        ms = {n: scale * sum(p.numel() for p in m.parameters()) for n, m in models.items()}
        ok = stable[len(calls) - 1]
        return ms, {"stable": ok, "reasons": [] if ok else ["teacher's latency varied by 40 %"]}
    return timing, calls


def test_all_shapes_and_the_teacher_are_timed_together_and_unstable_rounds_are_timed_again(monkeypatch):
    teacher = tiny_teacher()
    full, _ = full_size(teacher)
    timing, calls = fake_timing([1.4, 91.0, 30.0], [False, False, True])
    monkeypatch.setattr(latency, "checked_latency_ms", timing)
    model, teacher_ms, record = fit_latency_model(full, teacher, count=8, runs=2, seed=0)
    assert len(calls) == 3 and all(len(c) == 9 and "teacher" in c for c in calls)  # one measurement: 8 shapes + teacher
    assert teacher_ms == 30.0 and record["noise"]["stable"] and record["noise"]["rounds"] == 3
    # the machine's speed changed 65-fold between rounds: the ratios did not
    assert record["measurements"][0]["ratio"] == pytest.approx(1.0, rel=1e-6)  # the full shape is the teacher's size
    assert record["fit_error_mape"] >= 0


def test_the_rounds_are_bounded_and_instability_is_recorded(monkeypatch):
    teacher = tiny_teacher()
    full, _ = full_size(teacher)
    timing, calls = fake_timing([10.0] * 5, [False] * 5)
    monkeypatch.setattr(latency, "checked_latency_ms", timing)
    _, _, record = fit_latency_model(full, teacher, count=8, runs=2, seed=0)
    assert len(calls) == latency.noise.ROUNDS
    assert not record["noise"]["stable"] and record["noise"]["reasons"] == ["teacher's latency varied by 40 %"]


def test_too_few_shapes_are_refused():
    teacher = tiny_teacher()
    full, _ = full_size(teacher)
    with pytest.raises(Exception, match="at least 8 measured shapes"):
        fit_latency_model(full, teacher, count=4, runs=2, seed=0)


def test_the_kept_units_are_shifted_to_meet_the_target_and_keep_the_masks_order():
    from distillery.prune.masks import Masks, calibrated_gates, deterministic_gates, shape_of

    full, shapes, ratios = synthetic()
    c = full.config
    model = LatencyModel.fit(shapes, ratios, c.hidden_size)
    masks = Masks(c.num_hidden_layers, c.num_attention_heads, c.intermediate_size, c.hidden_size)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name in masks.names():
            getattr(masks, name).copy_(torch.randn(getattr(masks, name).shape, generator=g) / 200.0)
    full_ratio = float(model(shape_of(masks.gates("deterministic"), c.hidden_size)))
    for speedup in (1.5, 2.0, 4.0):
        gates, shift = calibrated_gates(masks, model, full_ratio / speedup)
        predicted = float(model(shape_of(gates, c.hidden_size)))
        # a tiny model's units are coarse (a sub-layer is 0.02-0.03 of 0.2 here): near the target, from below
        assert 0.6 * full_ratio / speedup < predicted <= full_ratio / speedup
        # the largest shape that fits: one more unit (a slightly larger shift) would not
        more, _ = calibrated_gates(masks, lambda s: model(s) - 1e-9, predicted + 0.02)
        assert float(model(shape_of(more, c.hidden_size))) >= predicted
        kept = deterministic_gates(masks.log_alpha("neurons") + shift)
        assert torch.equal(gates["neurons"] > 0, (kept * gates["ffn"][:, None]) > 0)  # the masks' order, shifted


def test_an_earlier_latency_json_is_reused_or_refused_in_a_sentence(tmp_path, monkeypatch):
    import json

    from distillery.errors import DistilleryError
    from distillery.prune.latency import reused_record, save_record

    teacher = tiny_teacher(num_hidden_layers=3)
    full, _ = full_size(teacher)
    timing, _ = fake_timing([10.0], [True])
    monkeypatch.setattr(latency, "checked_latency_ms", timing)
    _, _, record = fit_latency_model(full, teacher, count=8, runs=2, seed=0)
    path = save_record(tmp_path / "latency.json", record)
    assert reused_record(path, full)["model"] == record["model"]
    with pytest.raises(DistilleryError, match="another teacher's shape"):
        reused_record(path, full_size(tiny_teacher(num_hidden_layers=2))[0])
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**record, "hardware": {"cpu": "a CPU elsewhere"}}))
    with pytest.raises(DistilleryError, match="not on this machine"):
        reused_record(other, full)
    with pytest.raises(DistilleryError, match="not a readable latency.json"):
        reused_record(tmp_path / "missing.json", full)
    # the cheap mode keeps the hidden width: a line fitted on narrower shapes does not price its selection
    with pytest.raises(DistilleryError, match="shapes that prune the hidden dimension, and this run's shapes keep"):
        reused_record(path, full, prune_hidden=False)


def test_a_run_that_keeps_the_hidden_width_times_shapes_of_that_width(monkeypatch):
    """A cheap 8x STS-B student (hidden 384 of 384) measured 6.8x where a line fitted on shapes of smaller widths
    said 8.2x: the shapes timed are those the run can choose from, the same units either way."""
    from types import SimpleNamespace

    config = SimpleNamespace(**MINILM)
    for i in range(50):
        pruned = random_shape(config, random.Random(i))
        kept = random_shape(config, random.Random(i), prune_hidden=False)
        assert float(kept["hidden"]) == 384 and torch.equal(pruned["heads"], kept["heads"])
        assert torch.equal(pruned["neurons"], kept["neurons"])
    teacher = tiny_teacher()
    full, _ = full_size(teacher)
    timing, _ = fake_timing([10.0], [True])
    monkeypatch.setattr(latency, "checked_latency_ms", timing)
    _, _, record = fit_latency_model(full, teacher, count=8, runs=2, seed=0, prune_hidden=False)
    assert record["prune_hidden"] is False
    assert {m["hidden"] for m in record["measurements"]} == {float(full.config.hidden_size)}


# A line like the one fitted for the built-in teacher (6 layers, 12 heads, 1536 neurons, 384 wide) on this machine
MINILM = dict(num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536, hidden_size=384)
# (two fits under load: one pricing heads and a constant, one pricing FFN sub-layers)
MINILM_LINE = torch.tensor([0.044, 0.0, 0.00195, 0.00249, 0.0, 0.0000655])
MINILM_LINE_2 = torch.tensor([0.0, 0.00077, 0.00133, 0.0, 0.0376, 0.0000707])


def uniform_shape(config, rng):
    """The earlier draw: each layer's units uniform in 1..full (most shapes between 1.3x and 3x)."""
    L, H, F, D = (config.num_hidden_layers, config.num_attention_heads, config.intermediate_size, config.hidden_size)
    heads = [0 if rng.random() < 0.2 else rng.randint(1, H) for _ in range(L)]
    ffn = [0 if rng.random() < 0.2 else rng.randint(1, F) for _ in range(L)]
    return {"heads": torch.tensor(heads, dtype=torch.float), "neurons": torch.tensor(ffn, dtype=torch.float),
            "attention": torch.tensor([float(h > 0) for h in heads]), "ffn": torch.tensor([float(f > 0) for f in ffn]),
            "hidden": torch.tensor(float(rng.randint(D // 4, D)))}


def speedups(draw, count=47, seed=0, line=MINILM_LINE):
    from types import SimpleNamespace

    config, rng = SimpleNamespace(**MINILM), random.Random(seed)
    return [1 / float(features(s, 384) @ line) for s in (draw(config, rng) for _ in range(count))]


def test_random_shapes_cover_the_small_students_that_4x_to_12x_targets_keep():
    for seed, line in ((0, MINILM_LINE), (1, MINILM_LINE), (0, MINILM_LINE_2), (1, MINILM_LINE_2)):
        new, old = speedups(random_shape, seed=seed, line=line), speedups(uniform_shape, seed=seed, line=line)
        around_8x = lambda xs: sum(6 <= x <= 16 for x in xs)  # noqa: E731
        assert around_8x(new) >= len(new) // 5 and around_8x(new) > 3 * around_8x(old)
        assert sum(x < 2.5 for x in new) >= 5  # and still some large ones, for 2x targets
    config = __import__("types").SimpleNamespace(**MINILM)
    for s in (random_shape(config, random.Random(i)) for i in range(200)):
        assert 96 <= float(s["hidden"]) <= 384 and s["heads"].max() <= 12 and s["neurons"].max() <= 1536
        assert torch.equal(s["attention"], (s["heads"] > 0).float()) and torch.equal(s["ffn"], (s["neurons"] > 0).float())


def fitted_error(draw, relative: bool, truth, test, seed: int) -> float:
    """Mean relative error on ``test`` of a line fitted on 24 shapes of ``draw`` (the full one first) timed by ``truth``;
    ``relative`` False: the earlier plain least squares."""
    import numpy as np
    from scipy.optimize import nnls
    from types import SimpleNamespace

    config, rng = SimpleNamespace(**MINILM), random.Random(seed)
    shapes = [latency.full_shape_of(config)] + [draw(config, rng) for _ in range(23)]
    if relative:
        model = LatencyModel.fit(shapes, [truth(s) for s in shapes], 384)
    else:
        x = torch.stack([features(s, 384) for s in shapes]).double().numpy()
        model = LatencyModel(nnls(x, np.asarray([truth(s) for s in shapes]))[0], 384)
    return sum(abs(float(model(s)) - truth(s)) / truth(s) for s in test) / len(test)


def test_the_new_draws_and_relative_fit_price_4x_to_12x_shapes_better_when_the_truth_is_not_a_line():
    """Timings that are not a line in the features (a CPU's per-unit cost changes with a matrix's size: a power of
    the line, above 1 when small shapes are cheaper than the line through large ones, as the 4x target that measured
    8x was, below 1 when fixed costs dominate them): on the students a 4x-12x target keeps, the relative fit beats
    plain least squares on either draw, and the new draws with it beat the earlier draws and fit by half."""
    from types import SimpleNamespace

    config, before, after = SimpleNamespace(**MINILM), [], []
    for line in (MINILM_LINE, MINILM_LINE_2):
        for power in (1.25, 0.8):
            truth = lambda s, line=line, power=power: float(features(s, 384) @ line) ** power  # noqa: E731
            test = [s for s in (random_shape(config, random.Random(1000 + i)) for i in range(150))
                    if 4 <= 1 / truth(s) <= 12]
            assert len(test) > 20
            for draw in (random_shape, uniform_shape):
                assert fitted_error(draw, True, truth, test, 0) < fitted_error(draw, False, truth, test, 0)
            after.append(sum(fitted_error(random_shape, True, truth, test, seed) for seed in range(3)) / 3)
            before.append(sum(fitted_error(uniform_shape, False, truth, test, seed) for seed in range(3)) / 3)
    assert sum(after) < 0.5 * sum(before)


def test_a_latency_in_ms_is_the_teacher_s_latency_over_it_and_one_above_the_teacher_is_refused():
    from types import SimpleNamespace

    from distillery.errors import DistilleryError
    from distillery.prune.options import PruneOptions
    from distillery.prune.recipe import with_target

    ctx = SimpleNamespace(notes=[])
    assert with_target(ctx, PruneOptions(speedup=3.0), 40.0).speedup == 3.0 and not ctx.notes
    assert with_target(ctx, PruneOptions(latency_ms=10.0), 40.0).speedup == pytest.approx(4.0)
    assert "measured 40.00 ms here" in ctx.notes[0]
    with pytest.raises(DistilleryError, match="already runs in 40.00 ms"):
        with_target(ctx, PruneOptions(latency_ms=50.0), 40.0)


def test_compress_latency_ms_is_prune_s_target(monkeypatch, capsys, tmp_path):
    import distillery.cli as cli
    from tests.helpers import run_cli

    seen = {}
    monkeypatch.setattr(cli, "compress_and_show", lambda config, *a, **k: seen.setdefault("config", config))
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--method", "prune", "--task", "sst2", "--latency-ms", "12.5",
                           "--out", str(tmp_path / "run"))
    assert code == 0, err
    assert seen["config"].method_options["latency_ms"] == 12.5
