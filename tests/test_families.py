"""The contract: every method on every encoder family (tests/families.py's tiny random teachers, each with
its own tokenizer kind, 2 layers). Each cell compresses end to end on a small SST-2 slice (teacher fine-tuned
one epoch, student one epoch), loads the saved student back equal to 1e-5, and exports it to ONNX, whose
parity check must pass, wherever the student's graph is the family's own: distill's (the family's class) and
AutoTinyBERT's (its own attention in the family's position scheme) on every family. A MoEBERT student runs the
family's own layers (exported in distill's cell) with experts that are the same on every family (their ONNX parity:
tests/test_moebert.py, and tests/test_moebert_families.py for a shared layer and a GLU FFN), and a CMOW student is
the same graph on every family but for its inputs: those cells export where the inputs differ (token types or
none). An export costs a cell ~4 s of its ~5 (torch.export's tracing)."""

from __future__ import annotations

import json

import pytest
import torch

import distillery
from distillery.errors import DistilleryError
from tests.families import CELL_STUDENT, CELL_TEACHER_LAYERS, FAMILY_NAMES, NO_TOKEN_TYPES, compress
from tests.helpers import write_glue

METHODS = ("distill", "moebert", "cmow", "autotinybert")


@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    return write_glue(tmp_path_factory.mktemp("glue"), n_train=32, n_dev=16)


def dev_batch(folder):
    """A padded batch of real sentences in the student's own tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return dict(tokenizer(["the movie was good", "a bad and boring film with a dull plot"], padding=True,
                          return_tensors="pt"))


@pytest.fixture
def trained(monkeypatch):
    """The students the pipeline saves, as trained (in memory), by run folder."""
    import distillery.pipeline as pipeline

    students, save = {}, pipeline.save_model

    def recording(model, tokenizer, folder, *args, **kwargs):
        students[folder.parent] = model
        return save(model, tokenizer, folder, *args, **kwargs)

    monkeypatch.setattr(pipeline, "save_model", recording)
    return students


def logits(model, batch):
    with torch.no_grad():
        return model(**batch).logits


# The cells whose student's ONNX graph no other cell or test exports (the module docstring)
EXPORTED_CELLS = {("distill", f) for f in FAMILY_NAMES} | {("autotinybert", f) for f in FAMILY_NAMES} \
    | {("cmow", "bert"), ("cmow", "roberta")}


def check_cell(run, trained, export: bool = True):
    """Save -> load equal to 1e-5, and with ``export`` the ONNX export (its own parity check inside) computing the
    same."""
    from distillery.export import FP32_ATOL, FP32_RTOL, export_model

    batch = dev_batch(run / "student")
    expected = logits(trained[run], batch)
    torch.testing.assert_close(logits(distillery.load_student(run), batch), expected, atol=1e-5, rtol=1e-5)
    if not export:
        return
    onnx = export_model(run, "onnx", run.parent / "onnx")  # raises when its parity check fails
    torch.testing.assert_close(logits(distillery.load_student(onnx), batch), expected, atol=FP32_ATOL, rtol=FP32_RTOL)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_method_on_every_family(family, method, tiny_family, glue, trained, tmp_path):
    teacher = tiny_family(family, CELL_TEACHER_LAYERS)
    check_cell(compress(method, teacher, glue, tmp_path / "run", **CELL_STUDENT[method]), trained,
               export=(method, family) in EXPORTED_CELLS)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_distill_student_of_every_layer_is_the_teacher_and_hidden_loss_reads_every_family(family, tiny_family):
    """distill's student keeps the teacher's class: with every layer it computes the teacher's logits; Patient
    KD's hidden-state MSE and the attention KL pair student layer j with the teacher layer it came from (zero for
    that copy)."""
    from transformers import AutoModelForSequenceClassification

    from distillery.distill.recipe import build_student
    from distillery.training.losses import attention_weights, distillation_loss

    folder = tiny_family(family)
    teacher = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2).eval()
    batch = dev_batch(folder)
    every = build_student(teacher, [0, 1, 2, 3]).eval()
    torch.testing.assert_close(logits(every, batch), logits(teacher, batch))
    labelled = {**batch, "labels": torch.tensor([1, 0])}
    loss = distillation_loss("classification", teacher, 0.5, 2.0, hidden_weight=1.0, layer_map=[0, 1, 2, 3],
                             attention_weight=1.0)
    same = loss(every, labelled)[1]
    assert same["hidden"] == pytest.approx(0.0, abs=1e-10) and same["attention"] == pytest.approx(0.0, abs=1e-6)
    student = build_student(teacher, [1, 3]).train()
    total, logs = distillation_loss("classification", teacher, 0.5, 2.0, hidden_weight=1.0, layer_map=[1, 3],
                                    attention_weight=1.0)(student, labelled)
    total.backward()
    assert logs["hidden"] > 0 and logs["attention"] > 0 and torch.isfinite(total)
    # the weights the attention term compares carry no dropout, though the student trains: each layer's attention
    # module (where each family keeps that dropout) is out of training mode inside the block, and only there
    import distillery.encoders as encoders

    layout = encoders.layout_of(student.config)
    path = (layout.query or layout.qkv).rsplit(".", 1)[0]
    attention = [m for layer in encoders.encoder_layers(student) for m in encoders.submodule(layer, path).modules()]
    with attention_weights(student, teacher):
        assert len(student(**batch, output_attentions=True).attentions) == 2
        assert not any(m.training for m in attention)
    assert all(m.training for m in student.modules())


# A student is a teacher: the next method runs on it (given fine-tuned) and the report names the chain.


def assert_chain(run, first, second):
    """The run's metrics.json holds teacher -> student 1 -> student 2 and report.md shows it, comparing the
    final student with the original teacher (scored by the first run) and the direct one."""
    chain = json.loads((run / "metrics.json").read_text())["chain"]
    assert [link["method"] for link in chain] == [None, first, second]
    assert chain[1]["model"] == str(run.parent / "first" / "student") and chain[2]["model"] == str(run / "student")
    assert chain[0]["metrics"]["accuracy"] == json.loads((run.parent / "first" / "metrics.json").read_text())["teacher"]["accuracy"]
    report = (run / "report.md").read_text()
    assert "## Chain" in report and f"`{first}` student → `{second}` student." in report
    assert "original teacher" in report and "the direct teacher" in report


def test_distill_on_a_distill_student(tiny_family, glue, tmp_path):
    first = compress("distill", tiny_family("bert"), glue, tmp_path / "first")
    second = compress("distill", first / "student", glue, tmp_path / "second", finetuned=True,
                      **{"method_options.student_layers": 1})
    assert distillery.load_student(second).config.num_hidden_layers == 1
    assert_chain(second, "distill", "distill")


def test_cmow_on_a_moebert_student(tiny_bert, glue, tmp_path):
    first = compress("moebert", tiny_bert, glue, tmp_path / "first")
    second = compress("cmow", first / "student", glue, tmp_path / "second", finetuned=True)
    assert type(distillery.load_student(second)).__name__ == "CMOWForSequenceClassification"
    assert_chain(second, "moebert", "cmow")


def test_moebert_on_an_autotinybert_student(tiny_bert, glue, tmp_path):
    """MoEBERT on a searched architecture: the student's FFNs, read through its own layout, cut into experts."""
    first = compress("autotinybert", tiny_bert, glue, tmp_path / "first")
    second = compress("moebert", first / "student", glue, tmp_path / "second", finetuned=True)
    assert distillery.load_student(second).config.encoder_config.model_type == "autotinybert"
    assert_chain(second, "autotinybert", "moebert")
    with pytest.raises(DistilleryError, match="a distillery student's attention and positions are its own"):
        compress("autotinybert", first / "student", glue, tmp_path / "third", finetuned=True)


def test_a_method_that_cannot_restructure_a_student_says_so(tiny_bert, glue, tmp_path):
    first = compress("cmow", tiny_bert, glue, tmp_path / "first")
    with pytest.raises(DistilleryError, match="'cmow' student has no encoder layout"):
        compress("distill", first / "student", glue, tmp_path / "second", finetuned=True)


def test_the_chain_is_read_from_the_teachers_run_and_left_out_when_unreadable(tmp_path):
    from distillery.teacher import teacher_chain

    student = tmp_path / "run" / "student"
    student.mkdir(parents=True)
    (student / "config.json").write_text('{"model_type": "bert"}')
    assert teacher_chain(str(student)) is None  # no metrics.json: a plain folder
    (tmp_path / "run" / "config.yaml").write_text("method: moebert\nteacher: {name: bert-tiny}\n")
    (tmp_path / "run" / "metrics.json").write_text(json.dumps(
        {"task": "sst2", "teacher": {"accuracy": 0.9}, "student": {"accuracy": 0.8}}))
    assert teacher_chain(str(student)) == [
        {"model": "bert-tiny", "method": None, "task": "sst2", "metrics": {"accuracy": 0.9}},
        {"model": str(student), "method": "moebert", "task": "sst2", "metrics": {"accuracy": 0.8}}]
    (tmp_path / "run" / "metrics.json").write_text("{not json")
    assert teacher_chain(str(student)) is None


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_model_inputs_of_every_family(family, tiny_family):
    """``model_inputs`` gives each family what the batch filters it replaced gave it (the collated batch less
    its targets: every input the family's tokenizer makes, its forward names) on the model's device; a
    ``token_type_ids`` column is dropped for a family whose forward takes none."""
    import datasets
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from distillery.data.encode import MODEL_INPUTS, TARGETS, encode_pair, make_collate, model_inputs

    folder = tiny_family(family)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2).eval()
    raw = datasets.Dataset.from_dict({"text": ["the movie was good", "a bad film"],
                                      "text_pair": ["it was fun", "with a dull and boring plot"], "label": [1, 0]})
    encoded = encode_pair(raw, tokenizer, 24)
    batch = make_collate(tokenizer)([encoded[i] for i in range(len(encoded))])
    inputs = model_inputs(batch, model)
    assert list(inputs) == [k for k in batch if k not in TARGETS] == [k for k in batch if k in MODEL_INPUTS]
    assert ("token_type_ids" in inputs) == (family not in NO_TOKEN_TYPES)
    assert all(torch.equal(inputs[k], batch[k]) and inputs[k].device == model.device for k in inputs)
    torch.testing.assert_close(logits(model, inputs), logits(model, {k: batch[k] for k in inputs}))
    typed = {**batch, "token_type_ids": torch.zeros_like(batch["input_ids"])}
    untyped = {"distilbert", "mpnet", "modernbert"}  # RoBERTa's forward takes them (one type), its tokenizer makes none
    assert ("token_type_ids" in model_inputs(typed, model)) == (family not in untyped)


def test_model_inputs_pass_everything_through_a_wrapper_and_nothing_else():
    """A forward that names no input (DDP's, torch.compile's wrapper) gets every model input of the batch;
    the targets and bookkeeping columns never reach a model."""
    from torch import nn

    from distillery.data.encode import model_inputs

    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(1))

        def forward(self, *args, **kwargs):
            return kwargs

    ids = torch.ones(2, 3, dtype=torch.long)
    batch = {"input_ids": ids, "attention_mask": ids, "token_type_ids": ids, "labels": torch.ones(2),
             "teacher_logits": torch.ones(2, 2), "example_id": ids}
    assert list(model_inputs(batch, Wrapper())) == ["input_ids", "attention_mask", "token_type_ids"]
