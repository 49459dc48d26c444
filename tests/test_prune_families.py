"""Method prune on every encoder family (tests/families.py's tiny random teachers): the full-size pruned student
computes the teacher, and a smaller model cut by random masks computes what the masked one does. The method's own
training runs end to end in tests/test_prune.py; here each family's conversion and removal are checked alone."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from distillery.prune.extract import extract, full_size, kept_units
from distillery.prune.masks import MaskedModel
from tests.families import FAMILY_NAMES
from tests.helpers import random_masks


def sentences(folder):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return dict(tokenizer(["the movie was good", "a bad and boring film with a dull plot"], padding=True,
                          return_tensors="pt"))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_family_converts_and_removal_equals_masking(family, tiny_family):
    folder = tiny_family(family, 2)
    torch.manual_seed(0)
    teacher = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=3, trust_remote_code=False).eval()
    batch = sentences(folder)
    model, _ = full_size(teacher)
    with torch.no_grad():
        assert_close(model(**batch).logits, teacher(**batch).logits, atol=1e-5, rtol=1e-4)
        masked = MaskedModel(model, random_masks(model, seed=1)).eval()
        expected = masked(**batch).logits
        small = extract(model, masked.last_gates)
        assert_close(small(**batch).logits, expected, atol=1e-5, rtol=1e-4)
    assert sum(small.config.layer_heads) < model.config.num_hidden_layers * model.config.num_attention_heads


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_bare_encoder_converts_and_extracts_without_a_pooler_it_lacks(family, tiny_family):
    """An embedder's teacher is a bare encoder: a family whose pooler belongs to its classification head (RoBERTa's,
    MPNet's ``classifier.dense``) converts to a full-size model without one and extracts without one (the conversion
    failed on the pooler's missing weights for every embedder of those families)."""
    from transformers import AutoModel

    folder = tiny_family(family, 2)
    teacher = AutoModel.from_pretrained(folder).eval()
    batch = sentences(folder)
    real = batch["attention_mask"].bool()  # padding's states are no family's contract (ModernBERT unpads)
    model, kind = full_size(teacher)
    assert kind is None and (model.pooler is None) == (family not in ("bert", "albert"))
    with torch.no_grad():
        assert_close(model(**batch).last_hidden_state[real], teacher(**batch).last_hidden_state[real],
                     atol=1e-5, rtol=1e-4)
        masked = MaskedModel(model, random_masks(model, seed=1)).eval()
        expected = masked(**batch).last_hidden_state
        small = extract(model, masked.last_gates)
        assert (small.pooler is None) == (model.pooler is None)
        # the hidden dimensions kept: the masked model's others are zeros the pruned one does not hold
        hidden = kept_units(masked.last_gates, model.config.hidden_size)["hidden"]
        assert_close(small(**batch).last_hidden_state[real], expected[real][:, hidden], atol=1e-5, rtol=1e-4)
