"""Token classification with method cmow (an attention-free tagger on CMOW's per-token states) and the
static-embedding baseline's per-word tagger: the tagger against a slow per-position reference, padded equal to
unpadded, its exported scans equal to the eager ones; `distillery compress --task conll2003 --method cmow` end to
end with entity metrics, the int8 export and an fp32 ONNX export parity-checked and scored; the static tagger at
F1 1.0 on a separable toy set, and its row in a token task's report."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from distillery.cmow.modeling_cmow import CMOWConfig, CMOWForTokenClassification
from distillery.cmow.products import _scan_fixed_depth, prefix_products, suffix_products
from tests.helpers import assert_one_line_error, run_cli, tiny_ner_settings
from tests.oracles import sequential_product

VOCAB, SEP, TAGS = 99, 3, 5
TOL = dict(atol=1e-5, rtol=1e-5)


def tagger(**kw) -> CMOWForTokenClassification:
    base = dict(vocab_size=VOCAB, matrix_dim=4, vector_dim=16, head="linear", num_labels=TAGS, sep_token_id=SEP,
                init_std=0.1)
    torch.manual_seed(0)
    return CMOWForTokenClassification(CMOWConfig(**{**base, **kw})).eval()


# -- the tagger ------------------------------------------------------------------------------------------------


def test_tagger_reads_the_word_and_both_directions_at_each_position():
    model = tagger()
    enc = model.encoder
    ids = torch.randint(4, VOCAB, (1, 6))
    keep = torch.ones_like(ids, dtype=torch.bool)
    tok = enc.tokens(ids, keep)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    for i in range(6):  # the slow reference: one position at a time, sequential products
        fw = sequential_product(tok["fw"][:, : i + 1])  # X_1 ⋯ X_i
        bw = sequential_product(tok["bw"][:, i:].flip(1))  # X_n ⋯ X_i
        vec = tok["vec"][0]
        state = torch.cat([vec[i], fw.flatten(), bw.flatten(), vec[: i + 1].sum(0), vec[i:].sum(0)])
        assert_close(logits[0, i], model.head(state), **TOL)


@pytest.mark.parametrize("component", ["hybrid", "cmow", "cbow"])
def test_tagger_padded_equals_unpadded_and_learns(component):
    model = tagger(component=component)
    ids = torch.randint(4, VOCAB, (1, 5))
    padded = torch.cat([ids, torch.full((1, 3), 7)], 1)  # junk ids under the mask: the identity all the same
    mask = torch.cat([torch.ones(1, 5), torch.zeros(1, 3)], 1).long()
    with torch.no_grad():
        assert_close(model(input_ids=padded, attention_mask=mask).logits[:, :5], model(input_ids=ids).logits, **TOL)
    labels = torch.tensor([[-100, 1, 2, 0, -100]])
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(30):
        loss = model(input_ids=ids, labels=labels).loss
        first = first if first is not None else float(loss.detach())
        optimizer.zero_grad(), loss.backward(), optimizer.step()
    assert float(loss) < first / 4


@pytest.mark.parametrize("length", [1, 5, 16, 17, 40])
def test_exported_scans_equal_the_eager_ones(length):
    x = torch.eye(4) + 0.1 * torch.randn(2, length, 4, 4, generator=torch.Generator().manual_seed(length))
    assert_close(_scan_fixed_depth(x, reverse=False), prefix_products(x), **TOL)
    assert_close(_scan_fixed_depth(x, reverse=True), suffix_products(x), **TOL)


def test_tagger_save_load_and_auto_class(tmp_path):
    from transformers import AutoModelForTokenClassification

    model = tagger(head="mlp", head_hidden=8)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForTokenClassification.from_pretrained(tmp_path).eval()
    assert type(loaded) is CMOWForTokenClassification
    ids = torch.randint(4, VOCAB, (2, 9))
    with torch.no_grad():
        assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


# -- compress ---------------------------------------------------------------------------------------------------


def test_compress_conll2003_with_cmow_end_to_end(monkeypatch, capsys, tiny_bert, conll_dir, tmp_path):
    out = tmp_path / "run"
    settings = tiny_ner_settings(tmp_path / "s.yaml", **{"method_options.matrix_dim": 4, "method_options.vector_dim": 32,
                                                    "student.lr": 3e-3})
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "conll2003", "--data-dir", str(conll_dir),
                           "--teacher", tiny_bert, "--method", "cmow", "--out", str(out), "--config", str(settings),
                           "--int8", "--no-baselines")
    assert code == 0, err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["main_metric"] == "entity_f1"
    assert {"entity_f1", "entity_precision", "entity_recall", "token_accuracy", "f1_LOC"} <= set(metrics["student"])
    assert metrics["teacher"]["entity_f1"] > 0.5 and metrics["student"]["entity_f1"] > 0.3  # both learn the entities
    config = json.loads((out / "student" / "config.json").read_text())
    assert config["architectures"] == ["CMOWForTokenClassification"] and config["head"] == "linear"
    assert config["id2label"]["4"] == "B-PER"
    (int8,) = [name for name in metrics["others"] if "int8" in name]
    assert set(metrics["others"][int8]) == set(metrics["student"])
    # loaded as cmow students load (distillery's Auto registration), transformers' pipeline groups its tags
    import distillery
    from transformers import pipeline

    distillery.register_models()
    found = pipeline("token-classification", model=str(out / "student"), aggregation_strategy="simple")(
        ["the actor was born in paris", "where is london"])
    assert {e["entity_group"] for s in found for e in s} <= {"LOC", "ORG", "PER", "MISC"}
    train = json.loads((out / "train.json").read_text())
    assert any("per-token state" in note for note in train["notes"]), train["notes"]

    # the fp32 ONNX export: the scans' fixed-depth form, parity-checked against torch and scored like every export
    code, _, err = run_cli(monkeypatch, capsys, "export", str(out), "--format", "onnx", "--task", "conll2003",
                           "--data-dir", str(conll_dir))
    assert code == 0, err
    onnx = json.loads((out / "exports" / "student-onnx" / "distillery_export.json").read_text())
    assert onnx["head"] == "token-classification" and onnx["parity"]["fp32"]["passed"]
    assert onnx["scores"]["export"]["entity_f1"] == pytest.approx(onnx["scores"]["source"]["entity_f1"], abs=0.02)


def test_cmow_sentence_heads_are_refused_for_a_tagger(monkeypatch, capsys, tiny_bert, conll_dir, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "conll2003", "--data-dir", str(conll_dir),
                           "--teacher", tiny_bert, "--method", "cmow", "--option", "head=cnn",
                           "--out", str(tmp_path / "run"), "--no-baselines", "--no-int8")
    assert_one_line_error(code, err, "a cmow tagger's head is one of linear, mlp")
    assert not (tmp_path / "run").exists()
