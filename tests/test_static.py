"""Method static (issue 55): a static embedder distilled from a tiny embedding teacher (model2vec's recipe, then
fine-tuned on the teacher's sentence vectors), saved so that sentence-transformers loads it as ``StaticEmbedding`` in
a fresh process without distillery, giving the vectors distillery scored; another task kind is refused."""

from __future__ import annotations

import json

import pytest
import torch

from distillery.config import RunConfig
from distillery.errors import DistilleryError
from distillery.pipeline import compress
from distillery.runtime import load_model
from distillery.static.modeling_static import StaticEmbedder
from tests.helpers import (assert_sentence_transformers_gives_what_was_scored, make_tiny_bert, tiny_config,
                           write_embedding_data, write_sentence_transformer)


@pytest.fixture(scope="module")
def embedding_data(tmp_path_factory):
    return write_embedding_data(tmp_path_factory.mktemp("embedding-data"))


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    root = tmp_path_factory.mktemp("static-embedder")
    return write_sentence_transformer(make_tiny_bert(root / "bert", num_layers=2), root / "st")


@pytest.fixture(scope="module")
def cls_embedder(tmp_path_factory):
    root = tmp_path_factory.mktemp("static-cls-embedder")
    return write_sentence_transformer(make_tiny_bert(root / "bert", num_layers=2), root / "st", pooling="cls")


def run_static(teacher, data, out, **more):
    data_dir, texts = data
    return compress(tiny_config(teacher, data_dir, out, task="embedding", method="static",
                                **{"data.unlabeled_file": texts, "method_options.pca_dims": 16, **more}))


@pytest.mark.parametrize("teacher", ["embedder", "cls_embedder"])
def test_static_makes_a_static_embedding_that_sentence_transformers_loads_in_a_fresh_process(teacher, embedding_data,
                                                                                            tmp_path, request):
    """A CLS-pooled teacher's too: a table has no first token's state, so its student's vector is the mean of its
    tokens' vectors whatever the run's pooling, as ``StaticEmbedding`` computes it."""
    out = run_static(request.getfixturevalue(teacher), embedding_data, tmp_path / "run")
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"sts_spearman", "mrr_at_10"} <= set(metrics["student"])
    student = load_model(out / "student")
    assert isinstance(student, StaticEmbedder) and student.config.hidden_size == 16
    modules = json.loads((out / "student" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["StaticEmbedding", "Normalize"]
    notes = json.loads((out / "train.json").read_text())["notes"]
    assert any("before fine-tuning" in n for n in notes)
    config = RunConfig.load(out / "config.yaml")
    assert_sentence_transformers_gives_what_was_scored(out / "student", config, metrics, tmp_path,
                                                       first_module="StaticEmbedding")


def test_fine_tuning_moves_the_static_vectors_towards_the_teacher(embedder, embedding_data, tmp_path):
    """Without fine-tuning the student is model2vec's table, which every embedder run measures as its
    static-embedding baseline; with it, the table changes (and special tokens stay out of every mean)."""
    out = run_static(embedder, embedding_data, tmp_path / "plain", **{"method_options.fine_tune": False,
                                                                      "method_options.pca_dims": None,
                                                                      "baselines": True})
    metrics = json.loads((out / "metrics.json").read_text())
    baseline = metrics["baselines"]["static-embeddings"]
    for metric in ("sts_spearman", "mrr_at_10"):
        assert baseline[metric] == pytest.approx(metrics["student"][metric], abs=1e-9)
    assert "static-embeddings" in json.loads((out / "bench.json").read_text())["models"]
    plain = load_model(out / "student")
    tuned = load_model(run_static(embedder, embedding_data, tmp_path / "tuned") / "student")
    assert not torch.equal(plain.embedding.weight, tuned.embedding.weight)
    specials = torch.tensor(tuned.config.special_ids)
    assert len(specials) and not tuned.embedding.weight[specials].any()


def test_static_refuses_another_task_kind(tiny_bert4, glue_dir, tmp_path):
    with pytest.raises(DistilleryError, match="static makes a sentence embedder"):
        compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "run", method="static"))
