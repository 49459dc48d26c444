"""Method prune on ``--task embedding`` (issues 55 and 56): the heads and FFN neurons of a tiny embedder scored by
the Fisher information of the embedding kind's importance loss (an in-batch contrastive loss against the teacher's
own vectors) on the texts it learns from, kept to the target by the latency model, then distilled on the sentence
vectors. The pruned student (per-layer shapes, distillery's model type) is a sentence-transformers folder that loads
in a fresh process after ``distillery.register_models()`` and gives the vectors distillery scored."""

from __future__ import annotations

import json

import pytest
import torch

import distillery.prune.recipe  # noqa: F401  (imported before size_timed patches the timings: helpers.flop_timed)
from distillery.config import RunConfig
from distillery.export import read_manifest
from distillery.pipeline import compress
from distillery.runtime import load_model
from tests.helpers import (assert_sentence_transformers_gives_what_was_scored, dev_vectors, make_tiny_bert, size_timed,
                           tiny_config, write_embedding_data, write_sentence_transformer)

CHEAP = {"mode": "cheap", "fisher_examples": 32, "latency_shapes": 8, "latency_runs": 1, "speedup": 2.0}


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    root = tmp_path_factory.mktemp("embedder")
    return write_sentence_transformer(make_tiny_bert(root / "bert", num_layers=2), root / "st")


@pytest.fixture(scope="module")
def embedding_data(tmp_path_factory):
    return write_embedding_data(tmp_path_factory.mktemp("embedding-data"))


def _prune(embedder, embedding_data, out, more=None, **options):
    data_dir, texts = embedding_data
    return compress(tiny_config(embedder, data_dir, out, task="embedding", method="prune",
                                **{"data.unlabeled_file": texts, "student.epochs": 1.0, **(more or {}),
                                   **{f"method_options.{k}": v for k, v in {**CHEAP, **options}.items()}}))


def test_prune_cheap_makes_an_embedder_that_sentence_transformers_loads_the_same_twice(embedder, embedding_data,
                                                                                        tmp_path, monkeypatch):
    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "cache"))
    size_timed(monkeypatch)
    # the first run with its int8 and ONNX exports (the encoder with its pooling, parity-checked and scored)
    runs = [_prune(embedder, embedding_data, tmp_path / "run", {"int8": True, "export": ["onnx"]}),
            _prune(embedder, embedding_data, tmp_path / "again")]
    out = runs[0]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["main_metric"] == "sts_spearman" and {"sts_spearman", "mrr_at_10"} <= set(metrics["student"])
    shape = json.loads((out / "pruned_shape.json").read_text())
    assert shape["mode"] == "cheap" and shape["predicted_ratio"] <= 0.5
    student = load_model(out / "student")
    assert student.config.model_type == "prunedbert" and (out / "student" / "modules.json").is_file()
    assert list(student.config.layer_heads) == shape["layer_heads"]
    assert_sentence_transformers_gives_what_was_scored(out / "student", RunConfig.load(out / "config.yaml"), metrics,
                                                       tmp_path, register_models=True)
    # its ONNX export holds the pooling, the fp32 graph within the parity tolerance of torch; each export scored
    config, ours = RunConfig.load(out / "config.yaml"), dev_vectors(out / "student", RunConfig.load(out / "config.yaml"))[0]
    for fmt in ("onnx", "onnx-int8"):
        folder = out / "exports" / f"student-{fmt}"
        assert read_manifest(folder)["outputs"] == ["sentence_embedding"]
        assert "sts_spearman" in metrics["others"][f"student-{fmt}"]
    torch.testing.assert_close(torch.from_numpy(dev_vectors(out / "exports" / "student-onnx", config)[0]),
                               torch.from_numpy(ours), atol=1e-4, rtol=1e-4)
    # same seed, same student
    first, second = (load_model(run / "student").state_dict() for run in runs)
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
