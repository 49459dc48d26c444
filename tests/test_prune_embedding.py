"""Method prune on ``--task embedding`` (issues 55 and 56): the heads and FFN neurons of a tiny embedder scored by
the Fisher information of the embedding kind's importance loss (an in-batch contrastive loss against the teacher's
own vectors) on the texts it learns from, kept to the target by the latency model, then distilled on the sentence
vectors. The pruned student (per-layer shapes, distillery's model type) is a sentence-transformers folder that loads
in a fresh process after ``distillery.register_models()`` and gives the vectors distillery scored. Same seed, same
student, and a killed run resumed bitwise: tests/test_reproducible.py (prune-embedding)."""

from __future__ import annotations

import json

import pytest

import distillery.prune.recipe  # noqa: F401  (imported before size_timed patches the timings: helpers.flop_timed)
from distillery.config import RunConfig
from distillery.export import read_manifest
from distillery.pipeline import compress
from distillery.runtime import load_model
from tests.helpers import assert_sentence_transformers_gives_what_was_scored, size_timed, tiny_config

CHEAP = {"mode": "cheap", "fisher_examples": 32, "latency_shapes": 8, "latency_runs": 1, "speedup": 2.0}




def _prune(embedder, embedding_data, out, more=None, **options):
    data_dir, texts = embedding_data
    return compress(tiny_config(embedder, data_dir, out, task="embedding", method="prune",
                                **{"data.unlabeled_file": texts, "student.epochs": 1.0, **(more or {}),
                                   **{f"method_options.{k}": v for k, v in {**CHEAP, **options}.items()}}))


@pytest.fixture(scope="module")
def timed():
    """Method prune's timings proportional to the models' sizes (helpers.size_timed) for the module's runs."""
    with pytest.MonkeyPatch.context() as patch:
        size_timed(patch)
        yield


@pytest.fixture(scope="module")
def cheap_run(tiny_family, embedding_data, timed, tmp_path_factory):
    """A cheap-mode prune at 2×, with its int8 and ONNX exports, of a tiny MPNet embedder (all-mpnet-base-v2's
    family, whose base model has no pooler: its pooler is its classification head's; the other runs' BERT has one)."""
    from tests.helpers import write_sentence_transformer

    root = tmp_path_factory.mktemp("prune-cheap")
    embedder = write_sentence_transformer(tiny_family("mpnet", 2), root / "mpnet-st")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DISTILLERY_CACHE", str(root / "cache"))
        return _prune(embedder, embedding_data, root / "run", {"int8": True, "export": ["onnx"]})


def test_prune_cheap_makes_an_embedder_that_sentence_transformers_loads_after_register_models(cheap_run, tmp_path):
    out = cheap_run
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["main_metric"] == "sts_spearman" and {"sts_spearman", "mrr_at_10"} <= set(metrics["student"])
    shape = json.loads((out / "pruned_shape.json").read_text())
    assert shape["mode"] == "cheap" and shape["predicted_ratio"] <= 0.5
    notes = json.loads((out / "train.json").read_text())["notes"]
    assert any("Cheap mode" in note for note in notes) and not any("projection" in note for note in notes)
    student = load_model(out / "student")
    assert student.config.model_type == "prunedbert" and (out / "student" / "modules.json").is_file()
    kept = [h for h, f in zip(shape["layer_heads"], shape["layer_intermediate_sizes"]) if h or f]  # empty: dropped
    assert list(student.config.layer_heads) == kept and student.config.hidden_size == 32
    assert any("Head floor" in note for note in notes)  # the embedding kind's default, said
    assert_sentence_transformers_gives_what_was_scored(out / "student", RunConfig.load(out / "config.yaml"), metrics,
                                                       tmp_path, register_models=True)
    # its exports hold the pooling (the graph gives the sentence vector) and are scored; the fp32 graph is written
    # only within the parity tolerance of torch (the export's own check, tests/test_embedding.py asserts it)
    for fmt in ("onnx", "onnx-int8"):
        assert read_manifest(out / "exports" / f"student-{fmt}")["outputs"] == ["sentence_embedding"]
        assert "sts_spearman" in metrics["others"][f"student-{fmt}"]


def test_prune_full_mode_learns_masks_on_the_sentence_vectors(embedder, embedding_data, timed, tmp_path, monkeypatch):
    """The full mode's masks' phase distils the sentence vectors (the kind's distance) and the hidden states; a
    student whose hidden dimension was pruned learns through a projection onto the teacher's width."""
    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "cache"))
    # CoFi's start (every log α 0: the shift then cuts the hidden dimension too on this tiny teacher)
    out = _prune(embedder, embedding_data, tmp_path / "run", mode="full", mask_steps=3, mask_init=0.0)
    shape, metrics = (json.loads((out / name).read_text()) for name in ("pruned_shape.json", "metrics.json"))
    assert shape["mode"] == "full" and load_model(out / "student").config.model_type == "prunedbert"
    # its hidden dimension pruned: the student learned through a projection onto the teacher's width, not saved
    assert shape["hidden_size"] < 32, shape
    notes = json.loads((out / "train.json").read_text())["notes"]
    assert any("through a projection of the student's" in note for note in notes), notes
    assert "sts_spearman" in metrics["student"]
