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
    assert float(loss.detach()) < first / 4


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
                           "--int8", "--baselines")
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
    # the free baselines of a token task: the int8 teacher and the static tagger, scored, timed and in the report
    static = metrics["baselines"]["static-embeddings"]
    assert set(static) == set(metrics["student"]) and static["entity_f1"] > 0.5
    bench = json.loads((out / "bench.json").read_text())
    assert "static-embeddings" in json.dumps(bench)
    report = (out / "report.md").read_text()
    assert "| static-embeddings |" in report and "Against the free baselines measured here" in report
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


# -- the static-embedding baseline's tagger ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_data(tiny_bert, conll_dir):
    from distillery.config import DataConfig
    from distillery.data.encode import prepare_task_data
    from distillery.data.tasks import get_task
    from distillery.modeling import load_tokenizer

    tokenizer = load_tokenizer(tiny_bert)
    config = DataConfig(task="conll2003", data_dir=str(conll_dir), max_length=48)
    return tokenizer, prepare_task_data(get_task("conll2003"), tokenizer, config, splits=("train", "dev"))


@pytest.mark.parametrize("window", [0, 1])
def test_static_tagger_tags_a_separable_set_perfectly(tiny_bert, token_data, window):
    """Every synthetic word has one tag and its own token: the words' vectors separate the tags, and a linear
    tagger over them is right on every dev word. Its neighbours' vectors beside it (random here: the teacher is
    untrained) cost the regularised fit little."""
    from transformers import AutoModel

    from distillery import live_baselines as lb
    from distillery.evaluation import score

    tokenizer, task_data = token_data
    teacher = AutoModel.from_pretrained(tiny_bert).eval()
    model = lb.static_embedding_baseline(teacher, tokenizer, task_data, pca_dims=None, window=window)
    assert type(model) is lb.StaticTaggerModel and model.config.tagger and model.config.window == window
    scores = score(model, task_data)
    if window == 0:
        assert scores["entity_f1"] == 1.0 and scores["token_accuracy"] == 1.0
    else:
        assert scores["entity_f1"] > 0.95
    # the head folded into torch is scikit-learn's: the same decision at each labelled position
    batch = task_data.collate([task_data.dev[i] for i in range(4)])
    features = model.features(batch["input_ids"], batch["attention_mask"])
    labelled = batch["labels"] != -100
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[labelled]
    expected = model.sklearn_head.decision_function(features[labelled].double().numpy())
    fitted = torch.from_numpy(model.sklearn_head.classes_)  # the synthetic set has no MISC: its tags get -1e4
    assert_close(logits[:, fitted].double(), torch.from_numpy(expected), atol=1e-4, rtol=1e-4)
    assert (logits[:, [i for i in range(logits.shape[1]) if i not in fitted.tolist()]] == lb.LOGIT_ABSENT).all()
    assert np.array_equal(logits.argmax(-1).numpy(), model.sklearn_head.predict(features[labelled].double().numpy()))


def test_static_tagger_features_are_each_token_and_its_neighbours():
    from distillery import live_baselines as lb

    vectors = torch.randn(10, 3)
    counted = torch.ones(10)
    counted[1] = 0  # a special token: no word, a zero vector
    config = lb.StaticEmbeddingConfig(vocab_size=10, dim=3, num_outputs=2, normalize=False, tagger=True, window=1)
    model = lb.StaticTaggerModel(vectors, counted, torch.zeros(2, 9), torch.zeros(2), config)
    ids = torch.tensor([[1, 4, 5, 6, 1, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    f = model.features(ids, mask)[0]  # (6, 9)
    zero = torch.zeros(3)
    assert_close(f[1], torch.cat([zero, vectors[4], vectors[5]]))  # the first word: nothing (not [CLS]) before it
    assert_close(f[2], torch.cat([vectors[4], vectors[5], vectors[6]]))
    assert_close(f[3], torch.cat([vectors[5], vectors[6], zero]))  # [SEP] after the last word is nothing
    assert_close(f[5], torch.zeros(9))  # padding
