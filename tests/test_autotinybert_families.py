"""AutoTinyBERT on every encoder family: the super-net cut from a tiny random teacher of each family
(tests/families.py) is the teacher at full size, its sub-networks extract to standalone models that
save and load, and `compress --method autotinybert` runs end to end."""

from __future__ import annotations

import random

import pytest
import torch
from torch.testing import assert_close

from tests.families import FAMILY_NAMES
from tests.helpers import collate, examples

LAYOUT_FAMILY = {"xlm-roberta": "roberta"}  # a model type under another family's layout (distillery.encoders)
SENTENCES = ["the movie was good", "a bad film , not fun at all , really boring", "paris"]


def family_teacher(path, num_labels: int = 3):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    teacher = AutoModelForSequenceClassification.from_pretrained(path, num_labels=num_labels).eval()
    batch = dict(AutoTokenizer.from_pretrained(path)(SENTENCES, padding=True, return_tensors="pt"))
    assert batch["attention_mask"].min() == 0  # a padded batch
    return teacher, batch


def random_scores(net, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    c = net.config
    return (torch.rand(c.num_hidden_layers, c.intermediate_size, generator=g),
            torch.rand(c.num_hidden_layers, c.num_attention_heads, generator=g))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_full_size_subnetwork_is_the_teacher_and_slices_extract_save_and_load(family, tiny_family, tmp_path):
    from transformers import AutoModelForSequenceClassification

    import distillery
    from distillery.autotinybert.space import Arch
    from distillery.autotinybert.supernet import SuperNet

    teacher, batch = family_teacher(tiny_family(family))
    with torch.no_grad():
        expected = teacher(**batch).logits
        for strategy in ("heads", "head-dims"):
            net = SuperNet.from_teacher(teacher, strategy).eval()
            assert_close(net(**batch)["logits"], expected)
            assert_close(net.extract(net.space.full())(**batch).logits, expected)
            # rewired (heads, their Q/K/V rows, a relative bias's columns reordered layer by layer): still the teacher
            net.rewire(*random_scores(net))
            assert_close(net(**batch)["logits"], expected)
        full = net.space.full()
        smaller = [Arch(2, full.hidden, 24, full.heads, 16), net.space.sample(random.Random(3))]
        for arch in smaller:  # head-dims: every head keeps 4 of its 8 dimensions (rotary: 2 of each half)
            student = net.extract(arch)
            got = student(**batch).logits
            assert got.shape == expected.shape and torch.isfinite(got).all()
            assert_close(got, net(**batch, arch=arch)["logits"])
    student.save_pretrained(tmp_path)
    distillery.register_models()
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert loaded.config.family == LAYOUT_FAMILY.get(family, family)
    with torch.no_grad():
        assert_close(loaded(**batch).logits, got, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_bare_encoder_is_its_full_size_subnetwork_and_extracts_without_a_pooler_it_lacks(family, tiny_family,
                                                                                          tmp_path):
    """An embedder's teacher is a bare encoder: a family whose pooler belongs to its classification head (RoBERTa's,
    MPNet's ``classifier.dense``) gives a super-net without one, and a sub-network extracts without one too (it
    looked up ``pooler.dense.weight`` and failed with a KeyError, after the one-shot phase, on all-mpnet-base-v2)."""
    from transformers import AutoModel, AutoTokenizer

    from distillery.autotinybert.supernet import SuperNet

    torch.manual_seed(0)
    teacher = AutoModel.from_pretrained(tiny_family(family, 2)).eval()
    batch = dict(AutoTokenizer.from_pretrained(tiny_family(family, 2))(SENTENCES, padding=True, return_tensors="pt"))
    with torch.no_grad():
        expected = teacher(**batch).last_hidden_state
        net = SuperNet.from_teacher(teacher, "heads").eval()
        full = net.extract(net.space.full())
        assert (full.pooler is None) == (net.bert.pooler is None)
        real = batch["attention_mask"].bool()  # padding's states are no family's contract (ModernBERT unpads)
        assert_close(full(**batch).last_hidden_state[real], expected[real])
        assert net.extract(net.space.sample(random.Random(3)))(**batch).last_hidden_state.isfinite().all()
    # saved and loaded, it has no pooler either (config.pooler), not a randomly initialised one
    import distillery

    full.save_pretrained(tmp_path)
    distillery.register_models()
    loaded = AutoModel.from_pretrained(tmp_path).eval()
    assert (loaded.pooler is None) == (full.pooler is None) and loaded.config.pooler == (full.pooler is not None)
    with torch.no_grad():
        assert_close(loaded(**batch).last_hidden_state[real], expected[real])


@pytest.mark.parametrize("family", ["roberta", "mpnet", "deberta-v2", "modernbert"])
def test_head_importance_reads_the_layout(family, tiny_family):
    """attention_blocks finds the value (or fused qkv) and output projections of any family; where the
    FFN side of the importance pass reads the family too (BERT's module names here), the head scores
    match the explicit-mask reference."""
    from distillery.importance import attention_blocks, unit_importance
    from tests.oracles import reference_head_importance
    teacher, _ = family_teacher(tiny_family(family))
    blocks = attention_blocks(teacher)
    assert len(blocks) == teacher.config.num_hidden_layers
    value, out = blocks[0]
    assert out.in_features == teacher.config.hidden_size
    assert value.out_features == teacher.config.hidden_size * (3 if family == "modernbert" else 1)
    if family != "modernbert":
        data = examples("classification", n=6)
        _, heads = unit_importance(teacher, data, collate, "classification", batch_size=3, progress=False)
        assert_close(heads, reference_head_importance(teacher, data, collate, "classification"), rtol=1e-5, atol=1e-6)


def test_old_bert_students_load_as_they_were(tmp_path):
    """A student saved before the families (a config without their fields) is BERT's layer as before."""
    import json

    from transformers import AutoModelForSequenceClassification

    import distillery
    from distillery.autotinybert.modeling_autotinybert import AutoTinyBertConfig, AutoTinyBertForSequenceClassification

    torch.manual_seed(0)
    model = AutoTinyBertForSequenceClassification(AutoTinyBertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                                                     num_attention_heads=2, intermediate_size=24,
                                                                     qkv_size=8)).eval()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for key in ("family", "position_kind", "relative_attention", "pre_norm", "glu", "pooling", "pooler_activation",
                "pooler_bias", "pooler_norm", "linear_bias", "norm_bias", "embedding_size", "layer_windows"):
        config.pop(key, None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    distillery.register_models()
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    ids = torch.randint(5, 50, (2, 7))
    with torch.no_grad():
        assert_close(loaded(ids).logits, model(ids).logits)


@pytest.mark.parametrize("family", ["roberta", "deberta-v2", "modernbert"])
def test_qa_teacher_of_a_family_is_its_full_size_subnetwork(family, tiny_family):
    from transformers import AutoModelForQuestionAnswering

    from distillery.autotinybert.space import Arch
    from distillery.autotinybert.supernet import SuperNet
    from distillery.kinds import kind_of

    _, batch = family_teacher(tiny_family(family))
    torch.manual_seed(0)
    teacher = AutoModelForQuestionAnswering.from_pretrained(tiny_family(family)).eval()
    net = SuperNet.from_teacher(teacher, "head-dims").eval()
    assert net.kind is kind_of("qa")
    real = batch["attention_mask"].bool()  # DeBERTa zeroes padded tokens' embeddings and attention rows; the
    with torch.no_grad():                  # student computes them as any token: no real token's output changes
        expected = teacher(**batch)
        assert_close(net(**batch)["start_logits"][real], expected.start_logits[real])
        arch = Arch(2, 24, 24, 4, 16)
        student = net.extract(arch)
        assert_close(student(**batch).end_logits, net(**batch, arch=arch)["end_logits"])
        assert_close(net.extract(net.space.full())(**batch).start_logits[real], expected.start_logits[real])


@pytest.mark.parametrize("family", ["roberta", "electra", "modernbert"])
def test_token_classification_teacher_of_a_family_is_its_full_size_subnetwork(family, tiny_family):
    """A tagger's super-net (ModernBERT runs its prediction head on every token before the classifier, the
    others the classifier alone) is the teacher at full size, and a slice extracts to a token classifier."""
    from transformers import AutoModelForTokenClassification

    from distillery.autotinybert.space import Arch
    from distillery.autotinybert.supernet import SuperNet
    from distillery.kinds import kind_of

    _, batch = family_teacher(tiny_family(family))
    torch.manual_seed(0)
    teacher = AutoModelForTokenClassification.from_pretrained(tiny_family(family), num_labels=5).eval()
    net = SuperNet.from_teacher(teacher, "head-dims").eval()
    assert net.kind is kind_of("token_classification")
    assert (net.bert.pooler is not None) == (family == "modernbert")
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        expected = teacher(**batch).logits
        assert_close(net(**batch)["logits"][real], expected[real])
        assert_close(net.extract(net.space.full())(**batch).logits[real], expected[real])
        arch = Arch(2, 24, 24, 4, 16)
        student = net.extract(arch)
        assert type(student).__name__ == "AutoTinyBertForTokenClassification"
        assert_close(student(**batch).logits, net(**batch, arch=arch)["logits"])


def test_a_bert_supernet_folder_from_before_the_families_loads(tmp_path):
    """A super-net folder whose weights are a BertModel (as saved before the families) is converted on load."""
    import json

    from transformers import BertConfig, BertModel

    from distillery.autotinybert.oneshot import LAYER_RULE, load_supernet
    from distillery.weights import record_weights

    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=24)).eval()
    bert.save_pretrained(tmp_path)
    (tmp_path / "supernet.json").write_text(json.dumps({"strategy": "heads", "head_kind": None, "layer_rule": LAYER_RULE}))
    record_weights(tmp_path)
    net = load_supernet(tmp_path).eval()
    ids = torch.randint(5, 60, (2, 7))
    with torch.no_grad():
        assert_close(net(ids)["last_hidden_state"], bert(ids).last_hidden_state)
