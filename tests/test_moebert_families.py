"""MoEBERT on every encoder family (tests/families.py): the one-expert conversion is the teacher,
N experts with shared neurons convert, route and run, save -> load is exact, the importance scores
equal the per-example autograd reference (GLU and shared-layer families included), the refit
helps, and ``compress --method moebert`` runs end to end on a tiny slice."""

import json

import pytest
import torch
from torch.testing import assert_close
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

import distillery
from distillery.encoders import ffn_width, layout_of
from distillery.importance import ffn_importance
from distillery.moebert.convert import convert
from distillery.moebert.refit import refit_outputs
from tests.families import FAMILY_NAMES
from tests.helpers import TINY_BERT, write_glue
from tests.oracles import reference_importance

SENTENCES = ["a good movie", "the plot was boring and the actor was not fun at all", "fun", "paris is a city"]


def family_teacher(tiny_family, family, num_labels=3, num_layers=4):
    """The tiny teacher of ``family`` with a sequence-classification head, random non-zero biases
    (so that a bias that went astray would show), in eval mode; and its tokenizer."""
    path = tiny_family(family, num_layers)
    torch.manual_seed(0)
    teacher = AutoModelForSequenceClassification.from_pretrained(path, num_labels=num_labels).eval()
    with torch.no_grad():
        for name, p in teacher.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return teacher, AutoTokenizer.from_pretrained(path)


def padded(tokenizer, n=3):
    return dict(tokenizer(SENTENCES[:n], padding=True, return_tensors="pt"))


def shape(teacher):
    """(rows of importance scores, d_h) of a teacher."""
    from distillery.moebert.convert import dense_ffns

    return len(dense_ffns(teacher)), ffn_width(layout_of(teacher.config), teacher.config)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_one_expert_holding_every_neuron_is_the_teacher(family, tiny_family):
    teacher, tok = family_teacher(tiny_family, family)
    rows, d_h = shape(teacher)
    importance = torch.rand(rows, d_h, generator=torch.Generator().manual_seed(1))
    x = padded(tok)
    assert int(x["attention_mask"].sum()) < x["attention_mask"].numel()  # the batch has padding
    with torch.no_grad():
        expected = teacher(**x).logits
        for mode in ("tied", "cloned"):
            student = convert(teacher, importance, num_experts=1, expert_size=d_h, shared_size=8, shared_mode=mode)
            # the family's own modules, under the family's prefix; the base model a head saves is a MoEBERT one
            assert type(getattr(student, student.base_model_prefix)).__name__ == type(teacher.base_model).__name__
            assert type(student.base_model).__name__ == "MoEBertModel"
            assert_close(student(**x).logits, expected)
        # every neuron shared, four experts, the sentence gate made the identity: the teacher again
        student = convert(teacher, importance, num_experts=4, expert_size=d_h, shared_size=d_h, routing="gate",
                          gate_scale="straight-through")
        assert_close(student(**x).logits, expected)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_question_answering_teachers_convert_exactly(family, tiny_family):
    """The family's QA head; padding skips the experts, so only real positions must agree."""
    from transformers import AutoModelForQuestionAnswering

    torch.manual_seed(0)
    teacher = AutoModelForQuestionAnswering.from_pretrained(tiny_family(family)).eval()
    rows, d_h = shape(teacher)
    x = padded(AutoTokenizer.from_pretrained(tiny_family(family)))
    student = convert(teacher, torch.rand(rows, d_h), num_experts=1, expert_size=d_h, shared_size=8)
    assert type(student).__name__ == "MoEBertForQuestionAnswering"
    real = x["attention_mask"].bool()
    with torch.no_grad():
        out, ref = student(**x), teacher(**x)
    assert_close(out.start_logits[real], ref.start_logits[real])
    assert_close(out.end_logits[real], ref.end_logits[real])


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_experts_with_shared_neurons_convert_run_and_reload_exactly(family, tiny_family, tmp_path):
    teacher, tok = family_teacher(tiny_family, family)
    rows, d_h = shape(teacher)
    importance = torch.rand(rows, d_h, generator=torch.Generator().manual_seed(2))
    x = padded(tok)
    student = convert(teacher, importance, num_experts=4, expert_size=16, shared_size=8)
    with torch.no_grad():
        for layer in student.moe_layers:  # experts that differ, so that a wrong route would show after reloading
            layer.experts.w2.normal_(0, 0.5)
        out = student(**x, output_expert_load=True)
    calls = teacher.config.num_hidden_layers  # ALBERT's one layer is called once per repeat, routed per call
    assert out.logits.shape == (3, 3) and bool(torch.isfinite(out.logits).all())
    assert out.expert_load.shape == (calls, 4)
    assert (out.expert_load.sum(1) == x["attention_mask"].sum()).all()
    assert student.num_effective_parameters() < sum(p.numel() for p in student.parameters())
    student.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "moebert" and config["encoder_config"]["model_type"] == teacher.config.model_type
    loaded = distillery.load_student(tmp_path)
    with torch.no_grad():
        assert_close(loaded(**x).logits, student(**x).logits, atol=1e-5, rtol=1e-5)
    for a, b in zip(student.moe_layers, loaded.moe_layers):
        assert torch.equal(a.hash_table, b.hash_table)


@pytest.mark.parametrize("family", ["albert", "modernbert", "distilbert", "deberta-v2"])
def test_gate_routing_trains_a_step(family, tiny_family):
    """Gradients reach the experts, the gate (through its balance loss and scale) and the family's
    own modules."""
    teacher, tok = family_teacher(tiny_family, family)
    rows, d_h = shape(teacher)
    student = convert(teacher, torch.rand(rows, d_h), num_experts=3, expert_size=12, shared_size=4, routing="gate").train()
    out = student(**padded(tok))
    (out.logits.sum() + out.balance_loss).backward()
    layer = student.moe_layers[0]
    assert layer.experts.w1.grad is not None and layer.gate.linear.weight.grad is not None
    assert student.get_input_embeddings().weight.grad is not None


def _examples(tok, n=6):
    items = []
    for i in range(n):
        enc = tok(SENTENCES[i % len(SENTENCES)] + " good" * (i % 3))
        items.append({**{k: v for k, v in enc.items()}, "labels": i % 3})
    return items  # a list is a map-style dataset


def _collate(tok):
    def collate(items):
        labels = torch.tensor([x["labels"] for x in items])
        batch = tok.pad([{k: v for k, v in x.items() if k != "labels"} for x in items], return_tensors="pt")
        return {**dict(batch), "labels": labels}
    return collate


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_importance_equals_the_per_example_autograd_reference(family, tiny_family):
    """Eq. 4 from hooks, for a GLU (input and gate rows together), a shared layer (terms summed over
    its calls before the absolute value) and an FFN without biases."""
    teacher, tok = family_teacher(tiny_family, family)
    data = _examples(tok)
    fast = ffn_importance(teacher, data, _collate(tok), "classification", batch_size=3, progress=False)
    slow = reference_importance(teacher, data, _collate(tok), "classification")
    assert fast.shape == shape(teacher)
    assert_close(fast, slow, rtol=1e-4, atol=1e-5)
    assert all(p.grad is None for p in teacher.parameters())


@pytest.mark.parametrize("family", ["albert", "modernbert", "distilbert"])
def test_refit_improves_a_lossy_conversion(family, tiny_family):
    teacher, tok = family_teacher(tiny_family, family)
    rows, d_h = shape(teacher)
    student = convert(teacher, torch.rand(rows, d_h), num_experts=4, expert_size=10, shared_size=4)
    batches = [padded(tok, 4), padded(tok, 2)]
    errors = refit_outputs(student, teacher, batches, progress=False)
    assert len(errors) == rows and all(after < before for before, after in errors), errors
    exact = convert(teacher, torch.rand(rows, d_h), num_experts=1, expert_size=d_h, shared_size=4)
    refit_outputs(exact, teacher, batches, progress=False)
    with torch.no_grad():
        assert_close(exact(**padded(tok)).logits, teacher(**padded(tok)).logits)


def test_teachers_moebert_cannot_cut_get_a_sentence(tiny_family):
    from distillery.errors import DistilleryError
    from distillery.moebert.convert import teacher_layout

    teacher, _ = family_teacher(tiny_family, "bert")
    student = convert(teacher, None, num_experts=2, expert_size=16, shared_size=4, split="random")
    with pytest.raises(DistilleryError, match="already a MoEBERT model"):
        teacher_layout(student.config)
    albert = AutoConfig.from_pretrained(tiny_family("albert"), num_hidden_groups=2)
    with pytest.raises(DistilleryError, match="2 layer groups"):
        teacher_layout(albert)


# ------------------------------------------------------------------------------------------------
# End to end


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    return write_glue(tmp_path_factory.mktemp("moe-family-data"), n_train=48, n_dev=16)


# ------------------------------------------------------------------------------------------------
# ONNX, composition


@pytest.mark.parametrize("family, routing", [("albert", "hash-r"), ("modernbert", "gate")])
def test_onnx_export_parity(family, routing, tiny_family, tmp_path):
    """A shared layer (a hash table row per repeat) and a GLU FFN without biases export with their routing."""
    import distillery.export as ex

    # 2 layers: ModernBERT's first is a global-attention layer and its second a local one; ALBERT's repeats its one
    teacher, tok = family_teacher(tiny_family, family, num_labels=2, num_layers=2)
    rows, d_h = shape(teacher)
    student = convert(teacher, torch.rand(rows, d_h), num_experts=4, expert_size=12, shared_size=4, routing=routing)
    with torch.no_grad():
        for layer in student.moe_layers:
            layer.experts.w2.normal_(0, 0.5)
            if layer.gate is not None:
                layer.gate.linear.weight.normal_(0, 1.0)
    student.save_pretrained(tmp_path / "moe")
    tok.save_pretrained(tmp_path / "moe")
    out = ex.export_model(tmp_path / "moe", "onnx", tmp_path / "onnx")
    assert json.loads((out / "distillery_export.json").read_text())["parity"]["fp32"]["passed"]
    x = padded(tok)
    with torch.no_grad():
        assert_close(distillery.load_student(out)(**x).logits, student(**x).logits, atol=ex.FP32_ATOL, rtol=ex.FP32_RTOL)


def test_moebert_converts_a_student_whose_layout_encoders_describes(monkeypatch):
    """Composition: an AutoTinyBERT student (a searched architecture) as MoEBERT's teacher. Where
    encoders.py has no layout for it yet, one is given here (its FFN: intermediate.dense, act,
    output.dense)."""

    from distillery.autotinybert.modeling_autotinybert import (
        AutoTinyBertConfig,
        AutoTinyBertForSequenceClassification,
    )

    torch.manual_seed(0)
    config = AutoTinyBertConfig(**{**TINY_BERT, "intermediate_size": 40}, qkv_size=16, num_labels=2)
    teacher = AutoTinyBertForSequenceClassification(config).eval()
    ids = torch.randint(5, 99, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    student = convert(teacher, torch.rand(2, 40), num_experts=1, expert_size=40, shared_size=8)
    with torch.no_grad():
        assert_close(student(input_ids=ids, attention_mask=mask).logits, teacher(input_ids=ids, attention_mask=mask).logits)
    assert convert(teacher, torch.rand(2, 40), num_experts=4, expert_size=10, shared_size=2)(input_ids=ids).logits.shape == (2, 2)
