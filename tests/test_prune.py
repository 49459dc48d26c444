"""Method prune: hard-concrete masks, removal equal to masking, per-layer shapes through save/reload."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close
from transformers import (AutoModelForSequenceClassification, BertForQuestionAnswering, BertForSequenceClassification,
                          BertForTokenClassification)

import distillery
from distillery.prune.extract import extract, full_size
from distillery.prune.masks import Masks, MaskedModel, fold, keep_probability
from distillery.prune.modeling_prune import PrunedBertConfig, PrunedBertForSequenceClassification
from tests.helpers import TINY_BERT, pair_batch, random_masks, tiny_bert_config

TINY = dict(TINY_BERT, num_hidden_layers=3, max_position_embeddings=64)


def tiny_teacher(cls=BertForSequenceClassification, **kw):
    torch.manual_seed(0)
    labels = kw.pop("num_labels", 2 if cls is BertForQuestionAnswering else 3)
    return cls(tiny_bert_config(**{**TINY, **kw}, num_labels=labels, attn_implementation="sdpa")).eval()


@pytest.mark.parametrize("cls, key", [(BertForSequenceClassification, "logits"), (BertForQuestionAnswering, "start_logits"),
                                      (BertForTokenClassification, "logits")])
def test_full_size_model_equals_the_teacher(cls, key):
    teacher = tiny_teacher(cls)
    model, _ = full_size(teacher)
    with torch.no_grad():
        expected, got = teacher(**pair_batch(), output_hidden_states=True), model(**pair_batch(), output_hidden_states=True)
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
        expected = getattr(masked(**pair_batch()), key)
        gates = masked.last_gates
        small = extract(model, gates)
        got = getattr(small(**pair_batch()), key)
    c = small.config
    kept = [h for h, f in zip(gates["heads"].sum(-1), gates["neurons"].sum(-1)) if h + f > 0]
    assert c.layer_heads == [int(h) for h in kept]
    assert c.hidden_size == int(gates["hidden"].sum()) < model.config.hidden_size
    assert_close(got, expected)


def test_a_removed_sub_layer_passes_its_input_through():
    """Deterministic gates removing a whole attention and a whole FFN: the layers without them are identities where
    they were, and the smaller model equals the masked one."""
    model, _ = full_size(tiny_teacher())
    masks = random_masks(model, 3)
    with torch.no_grad():
        masks.attention.copy_(torch.tensor([5.0, -5.0, 5.0]) / 200.0)
        masks.ffn.copy_(torch.tensor([-5.0, 5.0, 5.0]) / 200.0)
    gates = fold(masks.gates("deterministic"))
    assert gates["heads"][1].sum() == 0 and gates["neurons"][0].sum() == 0
    small = extract(model, gates)
    assert small.bert.encoder.layer[1].attention is None and small.bert.encoder.layer[0].intermediate is None
    masked = MaskedModel(model, masks).eval()
    with torch.no_grad():
        assert_close(small(**pair_batch()).logits, masked(**pair_batch()).logits)


def test_gates_expected_and_deterministic():
    masks = Masks(2, 4, 8, 16, init=3.0)
    p = masks.gates("expected")
    assert all(bool((v > 0.9).all()) for v in p.values())
    with torch.no_grad():
        masks.heads.copy_(torch.tensor([9.0, -9.0, 9.0, -9.0, 9.0, 9.0, 9.0, 9.0]) / 200.0)
    g = masks.gates("deterministic")
    assert g["heads"].tolist() == [[1, 0, 1, 0], [1, 1, 1, 1]]
    torch.manual_seed(0)
    drawn = masks.gates("sample")["heads"]
    assert ((drawn >= 0) & (drawn <= 1)).all() and drawn[0, 1] == 0
    shape = masks.expected_shape()
    assert shape["heads"].shape == (2,) and float(shape["hidden"].detach()) <= 16
    assert keep_probability(torch.tensor(-5.0)) < 0.5 < keep_probability(torch.tensor(0.0)) < keep_probability(torch.tensor(3.0))


def test_per_layer_shapes_save_and_reload(tmp_path):
    model, _ = full_size(tiny_teacher())
    masks = random_masks(model, 4)
    small = extract(model, fold(masks.gates("deterministic")))
    small.save_pretrained(tmp_path)
    distillery.register_models()
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path, trust_remote_code=False).eval()
    assert isinstance(loaded, PrunedBertForSequenceClassification)
    assert loaded.config.layer_heads == small.config.layer_heads
    assert loaded.config.layer_intermediate_sizes == small.config.layer_intermediate_sizes
    with torch.no_grad():
        assert_close(loaded(**pair_batch()).logits, small(**pair_batch()).logits)


def test_a_bad_per_layer_shape_is_refused():
    with pytest.raises(Exception, match="layer_heads needs 3 counts"):
        PrunedBertConfig(**TINY, layer_heads=[1, 2])


def test_compress_prune_end_to_end_and_same_seed_same_student(tiny_bert, tmp_path, monkeypatch):
    import json

    from distillery.export import export_model
    from tests.helpers import prune_twice

    # timings differ from run to run, and the masks follow the latency model: timed by parameter count here, so that
    # the two runs see one latency model (a run's latency.json, which a resume reads, fixes it the same way)
    runs = prune_twice(tiny_bert, tmp_path, monkeypatch, mask_steps=4, latency_shapes=8, latency_runs=2, speedup=2.0)
    for out in runs:
        shape = json.loads((out / "pruned_shape.json").read_text())
        assert shape["predicted_ms"] > 0 and shape["target_ms"] > 0 and shape["predicted_ratio"] <= 0.5
        report = (out / "report.md").read_text()
        assert (out / "latency.json").is_file() and "latency model expects" in report
        assert "started from the cheap mode's selection" in report
    students = [distillery.load_student(out) for out in runs]
    assert type(students[0]).__name__ == "PrunedBertForSequenceClassification"
    onnx = export_model(tmp_path / "run" / "student", "onnx", tmp_path / "onnx")  # parity-checked on export
    assert (onnx / "model.onnx").is_file() or any(onnx.glob("*.onnx"))
    a, b = (s.state_dict() for s in students)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_the_masks_start_at_mask_init_whatever_their_learning_rate_scale():
    for scale in (200.0, 2000.0):
        masks = Masks(2, 4, 8, 16, init=4.0, lr_scale=scale)
        assert all(torch.allclose(masks.log_alpha(n), torch.full_like(masks.log_alpha(n), 4.0)) for n in masks.names())
        torch.manual_seed(0)
        drawn = torch.cat([g.flatten() for g in masks.gates("sample").values()])
        assert float((drawn == 1).float().mean()) > 0.8  # the teacher nearly intact at the start (init 0: 0.17)


def test_fine_tuning_past_2x_teaches_each_kept_layer_its_teacher_layer():
    """The deep-cut rule's hidden term on a pruned model that lost a whole layer: kept layer j against the teacher
    layer it was pruned from (0 where the pruned model starts as the teacher: removal with nothing removed), a
    finite gradient once units go."""
    from types import SimpleNamespace

    from distillery.kinds import kind_of
    from distillery.prune.extract import kept_units
    from distillery.prune.recipe import finetune_loss

    teacher = tiny_teacher()
    model, _ = full_size(teacher)
    masks = random_masks(model, 5, prune_hidden=False)
    with torch.no_grad():  # layer 1 loses both sub-layers
        masks.attention.copy_(torch.tensor([5.0, -5.0, 5.0]) / 200.0)
        masks.ffn.copy_(torch.tensor([5.0, -5.0, 5.0]) / 200.0)
    gates = fold(masks.gates("deterministic"))
    layers = kept_units(gates, model.config.hidden_size)["layers"]
    assert layers == [0, 2]
    small = extract(model, gates).train()
    chosen = SimpleNamespace(temperature=1.0, hidden_weight=1.0, hidden_layers=layers)
    loss_fn, extra = finetune_loss(kind_of("classification"), teacher, small, gates, 0.5, chosen)
    batch = {**pair_batch(), "labels": torch.tensor([0, 1, 2])}
    loss, logs = loss_fn(small, batch)
    assert extra == [] and logs["hidden"] > 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in small.parameters() if p.requires_grad
               and p.grad is not None)
    whole = extract(model, fold(Masks(3, model.config.num_attention_heads, model.config.intermediate_size,
                                      model.config.hidden_size, init=9.0, prune_hidden=False).gates("deterministic")))
    same = SimpleNamespace(temperature=1.0, hidden_weight=1.0, hidden_layers=[0, 1, 2])
    _, logs = finetune_loss(kind_of("classification"), teacher, whole.eval(), gates, 0.5, same)[0](whole.eval(), batch)
    assert logs["hidden"] == pytest.approx(0.0, abs=1e-8)


def test_a_pruned_hidden_width_learns_the_teacher_s_states_on_the_dimensions_it_kept():
    """The full mode prunes the hidden dimension: the student's dimension j is the teacher's kept[j], so the hidden
    term is the hidden MSE against the teacher's states sliced to those dimensions."""
    from types import SimpleNamespace

    from distillery.kinds import kind_of
    from distillery.prune.extract import kept_units
    from distillery.prune.recipe import finetune_loss
    from distillery.training.losses import hidden_mse

    teacher = tiny_teacher()
    model, _ = full_size(teacher)
    width = model.config.hidden_size
    masks = Masks(3, model.config.num_attention_heads, model.config.intermediate_size, width, init=9.0)
    with torch.no_grad():  # a few hidden dimensions go, nothing else
        masks.hidden.copy_(torch.where(torch.arange(width) % 5 == 2, -9.0, 9.0) / masks.lr_scale)
    gates = fold(masks.gates("deterministic"))
    kept = kept_units(gates, width)["hidden"]
    assert 0 < len(kept) < width
    small = extract(model, gates).eval()
    assert small.config.hidden_size == len(kept)
    chosen = SimpleNamespace(temperature=1.0, hidden_weight=1.0, hidden_layers=[0, 1, 2])
    batch = {**pair_batch(), "labels": torch.tensor([0, 1, 2])}
    loss_fn, extra = finetune_loss(kind_of("classification"), teacher, small, gates, 0.5, chosen)
    _, logs = loss_fn(small, batch)
    assert extra == []
    with torch.no_grad():
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
        s = small(**inputs, output_hidden_states=True).hidden_states
        t = teacher(**inputs, output_hidden_states=True).hidden_states
    expected = sum(hidden_mse(s[j], t[j][..., kept], attention_mask=batch["attention_mask"]) for j in range(4))
    assert logs["hidden"] == pytest.approx(float(expected), rel=1e-5)
