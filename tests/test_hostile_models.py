"""Hostile teachers and saved models (issue 31): weight integrity, checks before any model is built,
pickles that never run, heads replaced or named. The one-line errors themselves are rows of
tests/test_bad_inputs.py; here is what a row cannot say."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import time

import pytest
import torch

from distillery.errors import DistilleryError
from tests.helpers import assert_one_line_error, run_cli, write_glue


@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    return write_glue(tmp_path_factory.mktemp("glue"), n_train=16, n_dev=8)


def save_classifier(tiny_bert, folder, labels: int = 2, kind: str = "model"):
    """The tiny BERT with a ``labels``-output head, saved the way distillery saves every model."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from distillery.modeling import save_model

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=labels)
    save_model(model, AutoTokenizer.from_pretrained(tiny_bert), folder, kind=kind)
    return folder


def alter_one_byte(weights):
    """Change one byte inside the tensor data of a safetensors file: same size, header still valid."""
    data = bytearray(weights.read_bytes())
    start = 8 + struct.unpack("<Q", bytes(data[:8]))[0]  # the header's length, then the header, then the data
    position = start + (len(data) - start) // 2
    data[position] ^= 0x01
    weights.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_bert):
    return save_classifier(tiny_bert, tmp_path_factory.mktemp("saved") / "student")


def test_save_model_records_the_sha256_of_its_weights(saved):
    from distillery.weights import WEIGHTS_RECORD

    record = json.loads((saved / WEIGHTS_RECORD).read_text())
    assert record["sha256"] == {"model.safetensors": hashlib.sha256((saved / "model.safetensors").read_bytes()).hexdigest()}


@pytest.fixture
def altered(saved, tmp_path):
    folder = tmp_path / "student"
    shutil.copytree(saved, folder)
    alter_one_byte(folder / "model.safetensors")
    return folder


def test_load_student_refuses_an_altered_byte(altered):
    import distillery

    with pytest.raises(DistilleryError, match=r"model\.safetensors was changed after distillery saved it"):
        distillery.load_student(altered)


@pytest.mark.parametrize("command", ["eval", "bench", "export"])
def test_commands_refuse_an_altered_byte_naming_the_file(command, altered, glue, tmp_path, monkeypatch, capsys):
    args = {"eval": ["eval", str(altered), "--data-dir", str(glue)],
            "bench": ["bench", str(altered), "--latency-runs", "1", "--throughput-runs", "1"],
            "export": ["export", str(altered), "--format", "torch-int8", "--out", str(tmp_path / "x")]}[command]
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, str(altered / "model.safetensors"))
    assert not (tmp_path / "x").exists()


def test_an_unaltered_saved_model_and_a_users_folder_without_record_load(saved, altered):
    import distillery
    from distillery.errors import DistilleryError
    from distillery.folders import MARKER
    from distillery.weights import WEIGHTS_RECORD

    assert distillery.load_student(saved).config.num_labels == 2
    # issue 41: a folder distillery saved whose record was deleted cannot be verified, so it is not loaded
    (altered / WEIGHTS_RECORD).unlink()
    with pytest.raises(DistilleryError, match="has no weights record .* so its weights cannot be verified"):
        distillery.load_student(altered)
    (altered / MARKER).unlink()  # a user's own folder: nothing to check against, loads as before
    assert distillery.load_student(altered).config.num_labels == 2


@pytest.mark.parametrize("fmt, file", [("torch-int8", "model.safetensors"), ("onnx", "model.onnx")])
def test_an_export_records_its_weights_and_refuses_an_altered_byte(fmt, file, saved, tmp_path):
    import distillery
    from distillery.export import export_model
    from distillery.weights import WEIGHTS_RECORD

    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    folder = export_model(saved, fmt, tmp_path / "export")
    assert file in json.loads((folder / WEIGHTS_RECORD).read_text())["sha256"]
    distillery.load_student(folder)
    if file.endswith(".safetensors"):
        alter_one_byte(folder / file)
    else:  # a byte in the middle of the graph
        data = bytearray((folder / file).read_bytes())
        data[len(data) // 2] ^= 0x01
        (folder / file).write_bytes(bytes(data))
    with pytest.raises(DistilleryError, match=f"export/{file} was changed"):
        distillery.load_student(folder)


def test_a_saved_teacher_changed_in_place_is_refused_as_a_teacher(tiny_bert, glue, tmp_path, monkeypatch, capsys):
    teacher = save_classifier(tiny_bert, tmp_path / "teacher", kind="teacher")
    alter_one_byte(teacher / "model.safetensors")
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--teacher", str(teacher), "--teacher-finetuned",
                           "--data-dir", str(glue), "--out", str(tmp_path / "run"))
    assert_one_line_error(code, err, str(teacher / "model.safetensors"))


def test_a_config_of_100000_layers_is_refused_before_any_model_is_built(tiny_bert, glue, tmp_path, monkeypatch, capsys):
    import transformers

    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_bert, teacher)
    config = json.loads((teacher / "config.json").read_text())
    (teacher / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 100000}))

    def no_build(*args, **kwargs):
        raise AssertionError("a model was built before the config was checked against the weights")

    monkeypatch.setattr(transformers.PreTrainedModel, "__init__", no_build)
    started = time.monotonic()
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--teacher", str(teacher), "--data-dir", str(glue),
                           "--out", str(tmp_path / "run"))
    assert_one_line_error(code, err, "num_hidden_layers=100000")
    assert "holds 2 layers" in err
    assert time.monotonic() - started < 10


class Touch:
    """Unpickling this creates ``path``: the proof that a pickle ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


@pytest.fixture
def pickled(tiny_bert, tmp_path):
    """A classifier whose only weights are a pickle that would create ``ran`` if it were unpickled."""
    from safetensors.torch import load_file

    folder = save_classifier(tiny_bert, tmp_path / "pickled")
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    (folder / "distillery_weights.json").unlink()
    torch.save({**state, "payload": Touch(tmp_path / "ran")}, folder / "pytorch_model.bin")
    return folder


@pytest.mark.parametrize("command", ["compress", "teacher", "moebert", "eval", "export", "bench"])
def test_a_pickled_teacher_or_model_never_runs(command, pickled, glue, tmp_path, monkeypatch, capsys):
    folder, data = str(pickled), ["--data-dir", str(glue)]
    args = {"compress": ["compress", "--teacher", folder, *data, "--out", str(tmp_path / "run")],
            "teacher": ["teacher", "--teacher", folder, *data],
            "moebert": ["moebert", "importance", "--teacher", folder, *data, "--out", str(tmp_path / "i.safetensors")],
            "eval": ["eval", folder, *data],
            "export": ["export", folder, "--format", "torch-int8", "--out", str(tmp_path / "x")],
            "bench": ["bench", folder]}[command]
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, "save_pretrained(folder, safe_serialization=True)")
    assert str(pickled / "pytorch_model.bin") in err
    assert not (tmp_path / "ran").exists()


def test_a_head_of_another_shape_is_replaced_without_teacher_finetuned(tiny_bert, tmp_path):
    from safetensors.torch import load_file

    from distillery.data.tasks import get_task
    from distillery.teacher import load_teacher

    folder = save_classifier(tiny_bert, tmp_path / "regression", labels=1)
    model, _ = load_teacher(str(folder), get_task("sst2"))
    assert model.config.num_labels == 2 and model.classifier.weight.shape == (2, 32)
    saved = load_file(folder / "model.safetensors")
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in saved.items() if not k.startswith("classifier."))


def test_non_finite_outputs_are_refused_not_scored(tiny_bert, glue):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from distillery.evaluation import evaluate

    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    with torch.no_grad():
        model.classifier.bias.fill_(float("nan"))
    with pytest.raises(DistilleryError, match="not finite"):
        evaluate(model, "sst2", tokenizer=AutoTokenizer.from_pretrained(tiny_bert), data_dir=str(glue))



def code_folder(tiny_bert, root, model_type: str):
    """A copy of the tiny BERT whose config.json says its model is the folder's own code (``auto_map``) and names
    ``model_type``; importing that code (evil.py) creates ``root/ran``: the proof that it ran."""
    folder = root / model_type
    shutil.copytree(tiny_bert, folder)
    config = json.loads((folder / "config.json").read_text())
    auto_map = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel",
                "AutoModelForSequenceClassification": "evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps({**config, "model_type": model_type, "auto_map": auto_map}))
    (folder / "evil.py").write_text(f"open({str(root / 'ran')!r}, 'w').close()\n")
    return folder


# each command and each kind of type once (a real process costs seconds); both go through one check
@pytest.mark.parametrize("command,model_type", [("compress", "evilbert"), ("eval", "bert")])
def test_a_folder_with_its_own_code_is_refused_without_a_prompt_even_given_y(command, model_type, tiny_bert, glue,
                                                                             tmp_path):
    """Issue 52: transformers asked "Do you wish to run the custom code? [y/N]" and ran the folder's code on y;
    distillery refused the folder only afterwards. A real process, with y on its stdin."""
    import subprocess
    import sys

    folder = str(code_folder(tiny_bert, tmp_path, model_type))
    args = {"compress": ["compress", "--teacher", folder, "--data-dir", str(glue), "--out", str(tmp_path / "run")],
            "eval": ["eval", folder, "--data-dir", str(glue)]}[command]
    done = subprocess.run([sys.executable, "-m", "distillery.cli", *args], input="y\n", capture_output=True, text=True,
                          timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode not in (0, None)
    assert_one_line_error(done.returncode, done.stderr, f"{folder}/config.json maps the model to its own Python code")
    assert "[y/N]" not in output and "hf.co" not in output and "Traceback" not in output
    assert not (tmp_path / "ran").exists()


def test_every_load_refuses_a_folders_code_even_unchecked(tiny_bert, tmp_path, monkeypatch):
    """Behind the check of config.json, every load passes trust_remote_code=False: with the check switched
    off, the folder is still refused, by transformers, without a prompt and without running its code."""
    import builtins

    import distillery.modeling as modeling
    from distillery.teacher import teacher_config
    from tests.helpers import patch_everywhere

    folder = code_folder(tiny_bert, tmp_path, "evilbert")
    patch_everywhere(monkeypatch, modeling, "check_model_type", lambda *_: None)
    monkeypatch.setattr(builtins, "input", lambda *_: pytest.fail("transformers asked whether to run the folder's code"))
    for load in (modeling.read_config, teacher_config,
                 lambda f: modeling.load_checked(modeling.AutoModelForSequenceClassification, f, "the model")):
        with pytest.raises(DistilleryError, match="custom code"):
            load(str(folder))
    assert not (tmp_path / "ran").exists()


def test_every_from_pretrained_in_the_source_passes_trust_remote_code_false():
    """The rule the test above samples, read from the source: a new load cannot forget it."""
    import ast
    from pathlib import Path

    import distillery

    missing = []
    for path in Path(distillery.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("from_pretrained", "pipeline")):
                continue
            receiver = ast.unparse(node.func.value)
            if receiver.startswith("nn."):  # torch's EmbeddingBag.from_pretrained takes a tensor, not a folder
                continue
            given = {k.arg: ast.unparse(k.value) for k in node.keywords}
            if given.get("trust_remote_code") != "False":
                missing.append(f"{path.name}:{node.lineno} {receiver}.from_pretrained")
    assert not missing, missing
