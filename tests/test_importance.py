"""The shared importance pass (moebert's experts, autotinybert's rewiring): head scores against an
explicit-mask autograd reference, neuron scores unchanged by asking for heads too."""

from __future__ import annotations

import pytest
from torch.testing import assert_close
from transformers import BertForQuestionAnswering

from distillery.importance import ffn_importance, unit_importance
from tests.helpers import collate, examples, tiny_teacher
from tests.oracles import reference_head_importance


@pytest.mark.parametrize("kind", ["classification", "regression", "qa"])
def test_head_importance_equals_the_explicit_mask_reference(kind):
    if kind == "qa":
        model = tiny_teacher(BertForQuestionAnswering, num_labels=2)
        data = examples(kind, fixed_length=10)
    else:
        model = tiny_teacher(num_labels=1 if kind == "regression" else 3)
        data = examples(kind)
    neurons, heads = unit_importance(model, data, collate, kind, batch_size=4, progress=False)
    assert heads.shape == (model.config.num_hidden_layers, model.config.num_attention_heads)
    assert_close(heads, reference_head_importance(model, data, collate, kind), rtol=1e-5, atol=1e-6)
    assert (heads > 0).all()
    assert_close(neurons, ffn_importance(model, data, collate, kind, batch_size=4, progress=False))
    assert all(p.requires_grad and p.grad is None for p in model.parameters())
