"""Method prune: hard-concrete masks, removal equal to masking, per-layer shapes through save/reload."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close
from transformers import (AutoModelForSequenceClassification, BertForQuestionAnswering, BertForSequenceClassification,
                          BertForTokenClassification)

import distillery
from distillery.prune.extract import extract, full_size
from distillery.prune.masks import Masks, MaskedModel, deterministic_gates, fold, keep_probability, model_masks
from distillery.prune.modeling_prune import PrunedBertConfig, PrunedBertForSequenceClassification
from tests.helpers import TINY_BERT, tiny_bert_config

TINY = dict(TINY_BERT, num_hidden_layers=3, max_position_embeddings=64)


def tiny_teacher(cls=BertForSequenceClassification, **kw):
    torch.manual_seed(0)
    labels = kw.pop("num_labels", 2 if cls is BertForQuestionAnswering else 3)
    return cls(tiny_bert_config(**{**TINY, **kw}, num_labels=labels, attn_implementation="sdpa")).eval()


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 99, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 7:] = 0
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types)


def random_masks(model, seed=0, prune_hidden=True) -> Masks:
    c = model.config
    masks = Masks(c.num_hidden_layers, c.num_attention_heads, c.intermediate_size, c.hidden_size, prune_hidden=prune_hidden)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in masks.names():
            p = getattr(masks, name)
            p.copy_(torch.randn(p.shape, generator=g) * 4.0 / 200.0)
    return masks


@pytest.mark.parametrize("cls, key", [(BertForSequenceClassification, "logits"), (BertForQuestionAnswering, "start_logits"),
                                      (BertForTokenClassification, "logits")])
def test_full_size_model_equals_the_teacher(cls, key):
    teacher = tiny_teacher(cls)
    model, _ = full_size(teacher)
    with torch.no_grad():
        expected, got = teacher(**batch(), output_hidden_states=True), model(**batch(), output_hidden_states=True)
    assert_close(getattr(got, key), getattr(expected, key))
    for a, b in zip(got.hidden_states, expected.hidden_states):
        assert_close(a, b)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cls, key", [(BertForSequenceClassification, "logits"), (BertForQuestionAnswering, "end_logits"),
                                      (BertForTokenClassification, "logits")])
def test_removal_equals_masking(cls, key, seed):
    model, _ = full_size(tiny_teacher(cls))
    masked = MaskedModel(model, random_masks(model, seed)).eval()
    with torch.no_grad():
        expected = getattr(masked(**batch()), key)
        gates = masked.last_gates
        small = extract(model, gates)
        got = getattr(small(**batch()), key)
    c = small.config
    assert c.layer_heads == [int(h) for h in gates["heads"].sum(-1)]
    assert c.hidden_size == int(gates["hidden"].sum()) < model.config.hidden_size
    assert_close(got, expected)
