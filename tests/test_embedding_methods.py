"""Issue 55: the methods beyond distill and static on ``--task embedding``. A tiny embedder (a sentence-transformers
folder of a tiny random BERT) compressed by MoEBERT: its FFNs cut into experts by importance scored on the texts
(an in-batch contrastive loss, the task loss being 0 with no gradient on the teacher itself), trained on the
teacher's sentence vectors and its hidden states; the student folder loads in sentence-transformers in a fresh
process after ``distillery.register_models()`` and gives the vectors distillery scored."""

from __future__ import annotations

import json

import pytest
import torch

from distillery.config import RunConfig
from distillery.kinds import kind_of
from distillery.pipeline import compress
from distillery.runtime import load_model
from tests.helpers import (assert_sentence_transformers_gives_what_was_scored, make_tiny_bert, tiny_config,
                           write_embedding_data, write_sentence_transformer)

pytestmark = pytest.mark.usefixtures("steady_pretrained_timing")  # conftest: no timing decides a test


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    root = tmp_path_factory.mktemp("embedder")
    return write_sentence_transformer(make_tiny_bert(root / "bert", num_layers=2), root / "st")


@pytest.fixture(scope="module")
def embedding_data(tmp_path_factory):
    return write_embedding_data(tmp_path_factory.mktemp("embedding-data"))


def test_the_embedding_importance_loss_has_a_gradient_on_the_teacher_itself():
    """At the teacher's own vectors ``1 − cos`` is 0 with no gradient; the in-batch contrastive loss is not."""
    kind = kind_of("embedding")
    hidden = torch.randn(3, 5, 8, requires_grad=True)
    batch = {"attention_mask": torch.ones(3, 5, dtype=torch.long)}
    vectors = kind.distilled_positions({"last_hidden_state": hidden}, {"last_hidden_state": hidden}, batch)[0]
    batch["teacher_logits"] = vectors.detach()
    task = kind.task_loss({"last_hidden_state": hidden}, batch, reduction="none")
    (grad,) = torch.autograd.grad(task.sum(), hidden)
    assert float(grad.abs().max()) < 1e-5
    rows = kind.importance_loss({"last_hidden_state": hidden}, batch)
    assert rows.shape == (3,) and bool((rows > 0).all())
    (grad,) = torch.autograd.grad(rows.sum(), hidden)
    assert float(grad.abs().max()) > 1e-3


def test_moebert_makes_an_embedder_that_sentence_transformers_loads_after_register_models(embedder, embedding_data,
                                                                                          tmp_path):
    data_dir, texts = embedding_data
    out = compress(tiny_config(embedder, data_dir, tmp_path / "run", task="embedding", method="moebert",
                               **{"data.unlabeled_file": texts, "method_options.experts": 2,
                                  "method_options.importance_examples": 32}))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["main_metric"] == "sts_spearman"
    assert {"sts_spearman", "mrr_at_10"} <= set(metrics["student"])
    student = load_model(out / "student")
    assert student.config.model_type == "moebert" and student.config.num_experts == 2
    assert (out / "importance.safetensors").is_file() and (out / "student" / "modules.json").is_file()
    assert_sentence_transformers_gives_what_was_scored(out / "student", RunConfig.load(out / "config.yaml"), metrics,
                                                       tmp_path, register_models=True)
