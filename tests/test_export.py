"""distillery.export: ONNX parity for every student type, int8, export folders through load_student,
deployment variants in compress/bench/report, quantization-aware recovery, and refusals."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer, BertForQuestionAnswering, BertForSequenceClassification, RobertaForSequenceClassification

import distillery
from distillery import export as ex
from distillery import runtime
from distillery.bench import benchmark
from distillery.errors import DistilleryError
from distillery.folders import EXPORT_MANIFEST
from tests.helpers import LIVE_EXTRAS, assert_one_line_error, make_run, run_cli, tiny_config, write_glue

pytest.importorskip("onnxruntime")

FAST_BENCH = dict(latency_shape=(1, 16), throughput_shape=(4, 16), latency_runs=2, warmup=1, throughput_runs=1)


def _save_with_head(cls, base, folder, **kw):
    torch.manual_seed(0)
    model = cls.from_pretrained(base, **kw).eval()
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(base).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    return write_glue(tmp_path_factory.mktemp("data"), n_train=64, n_dev=24)


@pytest.fixture(scope="module")
def bert_cls(tiny_bert, tmp_path_factory):
    return _save_with_head(BertForSequenceClassification, tiny_bert, tmp_path_factory.mktemp("bert-cls"), num_labels=2)


@pytest.fixture(scope="module")
def roberta_cls(tiny_roberta, tmp_path_factory):
    return _save_with_head(RobertaForSequenceClassification, tiny_roberta, tmp_path_factory.mktemp("roberta-cls"), num_labels=3)


@pytest.fixture(scope="module")
def bert_qa(tiny_bert, tmp_path_factory):
    return _save_with_head(BertForQuestionAnswering, tiny_bert, tmp_path_factory.mktemp("bert-qa"))


def _inputs(folder, texts=("a good movie", "the plot was boring and not fun at all , really", "bad")):
    tok = AutoTokenizer.from_pretrained(folder)
    return dict(tok(list(texts), padding=True, return_tensors="pt"))  # padding: masks matter


@pytest.fixture(scope="module")
def bert_onnx(bert_cls, glue_dir, tmp_path_factory):
    return ex.export_model(bert_cls, "onnx", tmp_path_factory.mktemp("x") / "onnx", task="sst2",
                           data_dir=str(glue_dir), max_length=32)


@pytest.fixture(scope="module")
def bert_onnx_int8(bert_cls, tmp_path_factory):
    return ex.export_model(bert_cls, "onnx-int8", tmp_path_factory.mktemp("x") / "onnx-int8")


@pytest.fixture(scope="module")
def bert_torch_int8(bert_cls, tmp_path_factory):
    return ex.export_model(bert_cls, "torch-int8", tmp_path_factory.mktemp("x") / "torch-int8")


# ------------------------------------------------------------------------------ ONNX parity


def test_onnx_bert_classification_parity_on_dev_inputs(bert_cls, bert_onnx):
    manifest = json.loads((bert_onnx / EXPORT_MANIFEST).read_text())
    assert manifest["format"] == "onnx" and manifest["exporter"]["opset"] == ex.OPSET
    assert manifest["exporter"]["name"] == "torch.onnx.export(dynamo=True)"
    parity = manifest["parity"]["fp32"]
    assert parity["passed"] and parity["max_abs_diff"] <= ex.FP32_ATOL and parity["atol"] == ex.FP32_ATOL
    assert "sst2 dev inputs" in manifest["parity_inputs"]
    scores = manifest["scores"]
    assert scores["main_metric"] == "accuracy" and scores["examples"] == 24
    assert scores["export"]["accuracy"] == pytest.approx(scores["source"]["accuracy"])
    assert {"config.json", "tokenizer_config.json", "model.onnx"} <= {p.name for p in bert_onnx.iterdir()}

    onnx_model = distillery.load_student(bert_onnx)
    assert isinstance(onnx_model, ex.OnnxModel)
    torch_model = distillery.load_student(bert_cls)
    inputs = _inputs(bert_cls)  # other shapes than the export's example: the axes are dynamic
    with torch.no_grad():
        expected = torch_model(**inputs).logits
    got = onnx_model(**inputs).logits
    assert got.shape == expected.shape == (3, 2)
    torch.testing.assert_close(got, expected, atol=ex.FP32_ATOL, rtol=ex.FP32_RTOL)


def test_onnx_roberta_classification_parity(roberta_cls, tmp_path):
    out = ex.export_model(roberta_cls, "onnx", tmp_path / "onnx")
    manifest = json.loads((out / EXPORT_MANIFEST).read_text())
    assert manifest["inputs"] == ["input_ids", "attention_mask"]  # RoBERTa's tokenizer gives no token types
    assert manifest["parity"]["fp32"]["passed"] and "sample sentences" in manifest["parity_inputs"]
    onnx_model, torch_model = distillery.load_student(out), distillery.load_student(roberta_cls)
    inputs = _inputs(roberta_cls)
    with torch.no_grad():
        expected = torch_model(**inputs).logits
    torch.testing.assert_close(onnx_model(**inputs).logits, expected, atol=ex.FP32_ATOL, rtol=ex.FP32_RTOL)
    # zeros for token types, as a generic caller may send, are accepted; real ones are not
    ids = inputs["input_ids"]
    assert onnx_model(input_ids=ids, token_type_ids=torch.zeros_like(ids)).logits.shape == (3, 3)
    with pytest.raises(DistilleryError, match="token_type_ids"):
        onnx_model(input_ids=ids, token_type_ids=torch.ones_like(ids))


def test_onnx_question_answering_parity(bert_qa, tmp_path):
    out = ex.export_model(bert_qa, "onnx", tmp_path / "qa")
    manifest = json.loads((out / EXPORT_MANIFEST).read_text())
    assert manifest["head"] == "question-answering" and manifest["outputs"] == ["start_logits", "end_logits"]
    onnx_model, torch_model = distillery.load_student(out), distillery.load_student(bert_qa)
    tok = AutoTokenizer.from_pretrained(bert_qa)
    inputs = dict(tok(["where is it ?", "what city ?"], ["paris is a city in france .", "london"],
                      padding=True, return_tensors="pt"))
    with torch.no_grad():
        expected = torch_model(**inputs)
    got = onnx_model(**inputs)
    for name in ("start_logits", "end_logits"):
        assert getattr(got, name).shape == getattr(expected, name).shape
        torch.testing.assert_close(getattr(got, name), getattr(expected, name), atol=ex.FP32_ATOL, rtol=ex.FP32_RTOL)


def test_parity_failure_fails_the_export_and_writes_nothing(bert_cls, tmp_path, monkeypatch):
    monkeypatch.setattr(ex.parity, "FP32_ATOL", -1.0)  # no output can be that close: the check must refuse
    with pytest.raises(DistilleryError, match="beyond the tolerance"):
        ex.export_model(bert_cls, "onnx", tmp_path / "bad")
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad.tmp").exists()


def test_registered_inputs_override_the_tokenizer(bert_cls, tmp_path, monkeypatch):
    from transformers import BertConfig

    monkeypatch.setattr(BertConfig, "onnx_export", ex.OnnxSpec(inputs=("input_ids", "attention_mask")), raising=False)
    out = ex.export_model(bert_cls, "onnx", tmp_path / "two-inputs")
    assert json.loads((out / EXPORT_MANIFEST).read_text())["inputs"] == ["input_ids", "attention_mask"]


def test_an_export_computes_the_head_of_the_model_object(bert_cls, tmp_path):
    """A model built in code names no architecture in its config, and a bare encoder loaded from a classifier's
    folder names the classifier: each export computes what the model object computes (the first one's export was
    read as a bare encoder and failed on a missing hidden state)."""
    from transformers import AutoConfig, BertModel

    tok = AutoTokenizer.from_pretrained(bert_cls)
    config = AutoConfig.from_pretrained(bert_cls)
    config.architectures = None
    torch.manual_seed(0)
    for name, model, head, output in (
            ("built", BertForSequenceClassification(config).eval(), "sequence-classification", "logits"),
            ("bare", BertModel.from_pretrained(bert_cls).eval(), "base", "last_hidden_state")):
        folder = ex.export(model, tok, "torch-int8", tmp_path / name)  # the head decides both backends' outputs
        manifest = json.loads((folder / EXPORT_MANIFEST).read_text())
        assert (manifest["head"], manifest["outputs"]) == (head, [output]), name
        inputs = _inputs(bert_cls)
        with torch.no_grad():
            assert getattr(distillery.load_student(folder)(**inputs), output).shape == getattr(model(**inputs), output).shape


# ------------------------------------------------------------------------------ int8


@pytest.mark.parametrize("fixture", ["bert_onnx_int8", "bert_torch_int8"])
def test_int8_runs_with_the_same_shapes_and_near_outputs(request, fixture, bert_cls):
    folder = request.getfixturevalue(fixture)
    manifest = json.loads((folder / EXPORT_MANIFEST).read_text())
    assert manifest["format"] == fixture.removeprefix("bert_").replace("_", "-")
    assert manifest["parity"]["int8_vs_fp32"]["finite"]
    int8, fp32 = distillery.load_student(folder), distillery.load_student(bert_cls)
    inputs = _inputs(bert_cls)
    with torch.no_grad():
        expected = fp32(**inputs).logits
        got = int8(**inputs).logits
    assert got.shape == expected.shape
    torch.testing.assert_close(got.float(), expected, atol=0.05, rtol=0.05)


def test_torch_int8_folder_holds_fp32_safetensors_and_reloads_exactly(bert_cls, bert_torch_int8):
    names = {p.name for p in bert_torch_int8.iterdir()}
    assert "model.safetensors" in names and not any(n.endswith((".bin", ".pt", ".pkl")) for n in names)
    manifest = json.loads((bert_torch_int8 / EXPORT_MANIFEST).read_text())
    assert manifest["parity"]["reload_max_abs_diff"] == 0.0 and "quantize_dynamic" in manifest["on_load"]
    loaded = distillery.load_student(bert_torch_int8)
    assert isinstance(loaded, BertForSequenceClassification)
    assert type(loaded.bert.encoder.layer[0].intermediate.dense).__module__.startswith("torch.ao.nn.quantized.dynamic")
    inputs = _inputs(bert_cls)
    with torch.no_grad():
        again = ex.quantize_torch(distillery.load_student(bert_cls))(**inputs).logits
        torch.testing.assert_close(loaded(**inputs).logits, again, atol=0, rtol=0)


def test_int8_default_is_one_of_the_backends():
    assert ex.resolve_format("int8") == ex.DEFAULT_INT8 in ("onnx-int8", "torch-int8")
    import distillery.cmow.modeling_cmow  # noqa: F401  (registers CMOW's faster int8 backend)

    assert ex.resolve_format("int8", "cmow") == "torch-int8" and ex.resolve_format("onnx-int8", "cmow") == "onnx-int8"


def test_exports_score_and_benchmark_beside_the_fp32_model(bert_cls, bert_onnx, bert_onnx_int8, bert_torch_int8, glue_dir):
    result = benchmark({"teacher": bert_cls, "onnx": bert_onnx, "onnx-int8": bert_onnx_int8,
                        "torch-int8": bert_torch_int8}, **FAST_BENCH)
    models = result["models"]
    for name in ("onnx", "onnx-int8", "torch-int8"):
        assert models[name]["params"] == models["teacher"]["params"]  # the fp32 architecture's count
        assert models[name]["flops_per_token"] == pytest.approx(models["teacher"]["flops_per_token"])
        assert models[name]["latency_ms"]["median"] > 0 and name in result["speedups"]
    assert "onnxruntime" in models["onnx-int8"]["backend"] and "torch" in models["torch-int8"]["backend"]
    metrics = distillery.evaluate(bert_onnx_int8, "sst2", data_dir=str(glue_dir), max_length=32)
    assert 0.0 <= metrics["metrics"]["accuracy"] <= 1.0


# ------------------------------------------------------------------------------ bad targets


def test_bad_export_targets_are_sentences(bert_cls, bert_onnx, tmp_path):
    with pytest.raises(DistilleryError, match="Unknown export format 'fp16'"):
        ex.export_model(bert_cls, "fp16", tmp_path / "x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DistilleryError, match="not a saved model"):
        ex.export_model(tmp_path / "empty", "onnx")
    with pytest.raises(DistilleryError, match="already an export"):
        ex.export_model(bert_onnx, "onnx-int8")
    with pytest.raises(DistilleryError, match="already exists"):
        ex.export_model(bert_cls, "onnx", bert_onnx)
    with pytest.raises(DistilleryError, match="--recover needs --task"):
        ex.export_model(bert_cls, "torch-int8", tmp_path / "y", recover=True)
    with pytest.raises(DistilleryError, match="Unknown export format"):
        tiny_config("unused", tmp_path, tmp_path / "run", export=["fp16"])


def test_cli_export_errors_are_one_line(monkeypatch, capsys, tmp_path, bert_cls):
    code, _, err = run_cli(monkeypatch, capsys, "export", str(bert_cls), "--format", "fp16", "--out", str(tmp_path / "x"))
    assert_one_line_error(code, err, "Unknown export format")
    code, _, err = run_cli(monkeypatch, capsys, "export", str(tmp_path), "--format", "onnx")
    assert_one_line_error(code, err, "not a saved model")


def test_cli_export_writes_a_loadable_folder(monkeypatch, capsys, tmp_path, bert_cls):
    import sys

    from distillery import cli

    monkeypatch.setattr(sys, "argv", ["distillery", "export", str(bert_cls), "--format", "torch-int8", "--out", str(tmp_path / "q")])
    cli.main()  # returns on success
    assert '"format": "torch-int8"' in capsys.readouterr().out
    assert distillery.load_student(tmp_path / "q")(**_inputs(bert_cls)).logits.shape == (3, 2)


# ------------------------------------------------------------------------------ recovery


def test_fake_quant_linear_computes_what_dynamic_int8_computes():
    from torch.ao.quantization import quantize_dynamic

    torch.manual_seed(0)
    linear = torch.nn.Linear(37, 32)
    x = torch.randn(4, 9, 37) * 3
    with runtime.quiet():
        int8 = quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear}, dtype=torch.qint8)
    fake = ex.FakeQuantLinear(linear, reduce_range=torch.backends.quantized.engine in ("fbgemm", "x86"))
    with torch.no_grad():
        torch.testing.assert_close(fake(x), int8(x), atol=1e-5, rtol=0)  # far closer than fp32 is
        assert (linear(x) - int8(x)).abs().max() > 1e-3
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    weights = [m.weight for m in model if isinstance(m, torch.nn.Linear)]
    ex.prepare_fake_quant(model)
    assert all(isinstance(m, ex.FakeQuantLinear) for m in (model[0], model[2]))
    model(torch.randn(3, 4)).sum().backward()  # straight-through: gradients reach the weights
    assert all(w.grad is not None and w.grad.abs().sum() > 0 for w in weights)
    ex.strip_fake_quant(model)
    assert type(model[0]) is torch.nn.Linear and model[0].weight is weights[0]


def test_onnx_int8_weights_have_one_scale_per_output_channel(bert_onnx_int8):
    assert ex.read_manifest(bert_onnx_int8)["quantization"]["per_channel"] is True


def test_per_channel_fake_quant_computes_what_per_channel_dynamic_int8_computes():
    """The ONNX export quantizes weights per output channel: the recovery's fake quantization follows it."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    torch.manual_seed(0)
    linear = torch.nn.Linear(37, 32)
    with torch.no_grad():
        linear.weight[:4] *= 20  # a few large rows: one scale per tensor would flatten the others
    x = torch.randn(4, 9, 37) * 3
    with runtime.quiet():
        int8 = quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear: per_channel_dynamic_qconfig})
    reduce_range = torch.backends.quantized.engine in ("fbgemm", "x86")
    fake = ex.FakeQuantLinear(linear, reduce_range=reduce_range, per_channel=True)
    per_tensor = ex.FakeQuantLinear(linear, reduce_range=reduce_range)
    with torch.no_grad():
        torch.testing.assert_close(fake(x), int8(x), atol=1e-4, rtol=0)
        assert (per_tensor(x) - int8(x)).abs().max() > 1e-3


def test_recovery_pass_runs_through_the_trainer(bert_cls, glue_dir, tmp_path):
    out = ex.export_model(bert_cls, "torch-int8", tmp_path / "recovered", task="sst2", data_dir=str(glue_dir),
                          max_length=32, recover=True, recover_threshold=-100.0, recover_steps=4)
    recovery = json.loads((out / EXPORT_MANIFEST).read_text())["recovery"]
    assert recovery["steps"] == 4 and recovery["backend"] == "torch-int8"
    assert {"before", "after", "kept", "gain_points", "selection_metrics"} <= set(recovery)
    assert recovery["before"]["main_metric"] == "accuracy"
    model = distillery.load_student(out)
    assert not any(isinstance(m, ex.FakeQuantLinear) for m in model.modules())


def test_recovery_is_skipped_when_int8_loses_little(bert_cls, glue_dir, tmp_path):
    out = ex.export_model(bert_cls, "torch-int8", tmp_path / "skipped", task="sst2", data_dir=str(glue_dir),
                          max_length=32, recover=True, recover_threshold=100.0)
    recovery = json.loads((out / EXPORT_MANIFEST).read_text())["recovery"]
    assert set(recovery) == {"skipped", "before"}
    assert recovery["skipped"].endswith("not more than 100") and recovery["before"]["main_metric"] == "accuracy"
    assert not (tmp_path / "skipped.recover").exists()


# ------------------------------------------------------------------------------ compress, report


def test_compress_export_measures_and_reports_the_variants(tiny_bert4, glue_dir, tmp_path):
    from distillery.pipeline import compress

    out = compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "run", export=["int8", "torch-int8"],
                               **{**LIVE_EXTRAS, "student.epochs": 1.0, "teacher.train.epochs": 1.0}))
    default = ex.DEFAULT_INT8
    names = {f"teacher-{default}", f"student-{default}", "teacher-torch-int8", "student-torch-int8"}
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["others"]) == names
    bench = json.loads((out / "bench.json").read_text())
    assert set(bench["models"]) == {"teacher", "student", "teacher-int8", "static-embeddings"} | names  # + live baselines
    assert metrics["baselines"]["teacher-int8"] == metrics["others"][f"teacher-{default}"]  # the export, not a second one
    report = (out / "report.md").read_text()
    assert "## Deployment variants" in report and f"| student-{default} |" in report
    assert (out / "exports" / f"student-{default}" / EXPORT_MANIFEST).is_file()
    assert distillery.load_student(out / "exports" / "student-torch-int8") is not None

    merged = distillery.report.merge_runs([out, make_run(tmp_path / "other", method="moebert")], tmp_path / "merged")
    text = merged.read_text()
    assert f"| run | student-{default} |" in text and "| other | int8 |" in text
    assert f"`teacher-{default} (run)`" not in text  # teacher variants are not named after the method
    assert (tmp_path / "merged" / "plot.png").is_file()


def test_merge_runs_labels_teacher_variants_as_teachers(tmp_path):
    from distillery.report import merge_runs

    a = make_run(tmp_path / "a", method="moebert")
    metrics = json.loads((a / "metrics.json").read_text())
    bench = json.loads((a / "bench.json").read_text())
    metrics["others"]["teacher-onnx-int8"] = {"accuracy": 0.86}
    bench["models"]["teacher-onnx-int8"] = dict(bench["models"]["int8"])
    (a / "metrics.json").write_text(json.dumps(metrics))
    (a / "bench.json").write_text(json.dumps(bench))
    b = make_run(tmp_path / "b", method="cmow", student_acc=0.87, student_ms=5.0, extra=False)
    text = merge_runs([a, b], tmp_path / "merged").read_text()
    assert "| a | teacher-onnx-int8 |" in text and "| b | student |" in text
    report = distillery.report.write_report(a).read_text()
    assert "## Deployment variants" in report and "`teacher-onnx-int8`" in report


def test_cli_bench_measures_export_variants(monkeypatch, capsys, bert_cls):
    import sys

    from distillery import cli

    monkeypatch.setattr(sys, "argv", ["distillery", "bench", str(bert_cls), "--export", "torch-int8",
                                      "--latency-runs", "2", "--throughput-runs", "1"])
    cli.main()
    out = capsys.readouterr().out
    assert "| teacher-torch-int8 |" in out and '"teacher-torch-int8"' in out


def test_without_onnx_the_rest_still_works(bert_cls, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if not installed
    with pytest.raises(DistilleryError, match=r"pip install 'distillery\[onnx\]'"):
        ex.export_model(bert_cls, "onnx-int8", tmp_path / "x")
    out = ex.export_model(bert_cls, "torch-int8", tmp_path / "q")
    assert distillery.load_student(out)(**_inputs(bert_cls)).logits.shape == (3, 2)


# ------------------------------------------------------------------------------ CMOW and AutoTinyBERT


def _cmow_folder(tiny_bert, folder, **kw):
    from distillery.cmow.modeling_cmow import CMOWConfig, CMOWForSequenceClassification

    tok = AutoTokenizer.from_pretrained(tiny_bert)
    torch.manual_seed(0)
    config = CMOWConfig(vocab_size=tok.vocab_size, pad_token_id=tok.pad_token_id, sep_token_id=tok.sep_token_id,
                        num_labels=2, matrix_dim=4, vector_dim=16, init_std=0.3, **kw)  # σ 0.3: orders matter
    CMOWForSequenceClassification(config).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _lengths_inputs(folder, pairs: bool):
    """Batches of 1 and 3 at lengths around and over the CMOW graph's 16-token blocks."""
    tok = AutoTokenizer.from_pretrained(folder)
    words = "the plot was boring and the actors were not very good but the city looked great".split()
    texts = [" ".join(words[:n]) for n in (3, 12, 40)]
    if pairs:
        return [dict(tok(texts[:1], texts[1:2], return_tensors="pt")),
                dict(tok(texts, texts[::-1], padding=True, return_tensors="pt"))]
    return [dict(tok(texts[:1], return_tensors="pt")), dict(tok(texts, padding=True, return_tensors="pt"))]


@pytest.mark.parametrize("pair_mode,head", [("joint", "cnn"), ("diffcat", "mlp")])  # each pair mode, each head
def test_onnx_cmow_parity_at_any_length(pair_mode, head, tiny_bert, tmp_path):
    """The exported CMOW graph multiplies in 16-token blocks with a fixed number of steps; the
    wrapper pads to a block multiple. Outputs equal torch's at lengths off the block size."""
    folder = _cmow_folder(tiny_bert, tmp_path / "cmow", pair_mode=pair_mode, head=head)
    out = ex.export_model(folder, "onnx", tmp_path / "onnx")
    manifest = json.loads((out / EXPORT_MANIFEST).read_text())
    assert manifest["parity"]["fp32"]["passed"] and manifest["seq_multiple"] == 16
    onnx_model, torch_model = distillery.load_student(out), distillery.load_student(folder)
    for inputs in _lengths_inputs(folder, pairs=pair_mode == "diffcat"):
        assert inputs["input_ids"].shape[1] % 16  # the wrapper has something to pad
        with torch.no_grad():
            torch.testing.assert_close(onnx_model(**inputs).logits, torch_model(**inputs).logits,
                                       atol=ex.FP32_ATOL, rtol=ex.FP32_RTOL)
    too_long = torch.ones(1, manifest["max_length"] + 1, dtype=torch.long)
    with pytest.raises(DistilleryError, match="at most"):
        onnx_model(input_ids=too_long)
    int8 = distillery.load_student(ex.export_model(folder, "onnx-int8", tmp_path / "int8"))
    assert int8(**_lengths_inputs(folder, pair_mode == "diffcat")[1]).logits.shape == (3, 2)


def test_cmow_fixed_depth_product_equals_the_loop():
    from distillery.cmow.modeling_cmow import EXPORT_CHUNK, _tree_product_fixed_depth, tree_product

    from tests.oracles import sequential_product

    torch.manual_seed(0)
    for length in (1, 7, EXPORT_CHUNK, 3 * EXPORT_CHUNK + 5, 256):  # the graph pads any length with identities
        x = torch.eye(5) + 0.2 * torch.randn(2, length, 5, 5)
        torch.testing.assert_close(_tree_product_fixed_depth(x, False), tree_product(x), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(_tree_product_fixed_depth(x, True), sequential_product(x.flip(1)), atol=1e-5, rtol=1e-4)


def test_cmow_exports_at_a_length_off_the_block_multiple():
    """torch.export with every axis Dim.AUTO at length 7, as transformers' exporters trace (the graph once
    assumed lengths padded to a multiple of EXPORT_CHUNK and failed there): equal to eager. (At an example
    shorter than one block the trace specialises to one block, as an example batch of 1 would to batch 1.)"""
    from distillery.cmow.modeling_cmow import CMOWConfig, CMOWForSequenceClassification

    torch.manual_seed(0)
    model = CMOWForSequenceClassification(CMOWConfig(vocab_size=99, matrix_dim=4, vector_dim=16, head_hidden=8,
                                                     sep_token_id=3, init_std=0.1)).eval()
    ids = torch.randint(5, 99, (2, 7))
    auto = {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}
    graph = torch.export.export(model, (), {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                                dynamic_shapes={"input_ids": auto, "attention_mask": auto}).module()
    for batch, length in ((2, 7), (3, 11)):
        ids = torch.randint(5, 99, (batch, length))
        mask = torch.ones_like(ids)
        mask[1, length // 2:] = 0
        with torch.no_grad():
            torch.testing.assert_close(graph(input_ids=ids, attention_mask=mask).logits,
                                       model(input_ids=ids, attention_mask=mask).logits, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dynamic", [False, True])
def test_cmow_through_transformers_dynamo_exporter_at_length_7(dynamic):
    """transformers' own exporter (what its ExportTesterMixin drives), static and with Dim.AUTO axes."""
    exporter = pytest.importorskip("transformers.exporters.exporter_dynamo")
    from transformers.exporters.configs import DynamoConfig

    from distillery.cmow.modeling_cmow import CMOWConfig, CMOWForSequenceClassification

    torch.manual_seed(0)
    model = CMOWForSequenceClassification(CMOWConfig(vocab_size=99, matrix_dim=4, vector_dim=16, head_hidden=8,
                                                     sep_token_id=3, init_std=0.1)).eval()
    ids = torch.randint(5, 99, (13, 7))
    x = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    program, _ = exporter.DynamoExporter().export_program(model, dict(x), DynamoConfig(dynamic=dynamic))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(**x).logits, model(**x).logits, atol=1e-5, rtol=1e-4)


def test_cmow_bilstm_head_refuses_onnx_with_a_sentence(tiny_bert, tmp_path):
    folder = _cmow_folder(tiny_bert, tmp_path / "cmow", head="bilstm", lstm_hidden=8)
    with pytest.raises(DistilleryError, match="BiLSTM head does not export"):
        ex.export_model(folder, "onnx", tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()
    assert distillery.load_student(ex.export_model(folder, "torch-int8", tmp_path / "int8"))(
        **_lengths_inputs(folder, False)[1]).logits.shape == (3, 2)


@pytest.mark.parametrize("strategy", ["heads", "head-dims"])
def test_onnx_autotinybert_parity(strategy, tiny_bert, tmp_path):
    from distillery.autotinybert.space import Arch
    from distillery.autotinybert.supernet import SuperNet

    torch.manual_seed(0)
    teacher = BertForSequenceClassification.from_pretrained(tiny_bert, num_labels=2).eval()
    supernet = SuperNet.from_teacher(teacher, strategy)
    arch = Arch(layers=1, hidden=24, ffn=20, heads=2 if strategy == "heads" else 4, qkv=16)
    folder = tmp_path / "atb"
    supernet.extract(arch).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(folder)
    out = ex.export_model(folder, "onnx", tmp_path / "onnx")
    assert json.loads((out / EXPORT_MANIFEST).read_text())["parity"]["fp32"]["passed"]
    onnx_model, torch_model = distillery.load_student(out), distillery.load_student(folder)
    for inputs in _lengths_inputs(folder, pairs=False):  # batch 1 without padding, batch 3 with
        with torch.no_grad():
            torch.testing.assert_close(onnx_model(**inputs).logits, torch_model(**inputs).logits,
                                       atol=ex.FP32_ATOL, rtol=ex.FP32_RTOL)


def test_a_model_exported_to_several_onnx_formats_is_traced_once(tiny_bert, tmp_path, monkeypatch):
    """The fp32 graph of a model is traced once a process: its onnx and onnx-int8 exports (and a second load of
    the same folder) reuse it, byte for byte; other weights are traced again."""
    from distillery.export import onnx as xo

    monkeypatch.setattr(xo, "_TRACED", {})  # an earlier test may have traced this very model
    traced = []
    real = xo.export_onnx
    monkeypatch.setattr(xo, "export_onnx", lambda model, *a: traced.append(type(model).__name__) or real(model, *a))
    folder = _cmow_folder(tiny_bert, tmp_path / "cmow")
    fp32 = ex.export_model(folder, "onnx", tmp_path / "onnx")
    int8 = ex.export_model(folder, "onnx-int8", tmp_path / "int8")
    assert len(traced) == 1
    again = ex.export_model(folder, "onnx", tmp_path / "again")
    assert len(traced) == 1 and (again / "model.onnx").read_bytes() == (fp32 / "model.onnx").read_bytes()
    assert json.loads((int8 / EXPORT_MANIFEST).read_text())["parity"]["int8_vs_fp32"]
    other = _cmow_folder(tiny_bert, tmp_path / "other", head="cnn")
    ex.export_model(other, "onnx", tmp_path / "other-onnx")
    assert len(traced) == 2


def test_kept_exports_are_reused_and_a_damaged_one_is_made_again(bert_cls, tmp_path, monkeypatch):
    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "cache"))
    model, tokenizer = distillery.load_student(bert_cls), AutoTokenizer.from_pretrained(bert_cls)
    kept = ex.kept_exports_folder(bert_cls, None)
    assert kept.is_relative_to(tmp_path / "cache") and ex.kept_exports_folder(tmp_path / "absent", None) is None
    made = lambda: ex.build_variants({"teacher": (model, tokenizer)}, ["onnx"], kept={"teacher": kept})[0]["teacher-onnx"]
    inputs = dict(tokenizer(["a good movie"], return_tensors="pt"))
    first = made()
    onnx_file = next(kept.rglob("*.onnx"))
    stamp = onnx_file.stat().st_mtime_ns
    again = made()  # loaded from the cache, not exported again
    assert onnx_file.stat().st_mtime_ns == stamp
    torch.testing.assert_close(torch.as_tensor(again(**inputs).logits), torch.as_tensor(first(**inputs).logits))
    onnx_file.write_bytes(b"damaged")  # left alone (distillery replaces only what it wrote), exported again elsewhere
    torch.testing.assert_close(torch.as_tensor(made()(**inputs).logits), torch.as_tensor(first(**inputs).logits))
    assert onnx_file.read_bytes() == b"damaged"
