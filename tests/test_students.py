"""The student contract, checked the same way for every student type (DESIGN.md, "Contracts").

Each type is built tiny, the way its own tests build it: distill's layer-drop BERT student, a
converted MoEBERT, a CMOW/CBOW-Hybrid, and a sub-network extracted from an AutoTinyBERT super-net;
with a classification head, and with a QA head where the type has one (CMOW has none). Every one
must give the head's output shapes, survive ``save_pretrained`` → load (safetensors only) equal
within 1e-5 on the same inputs, round-trip through ``AutoConfig`` / ``AutoModelFor*`` once the
student types are registered, and come back equal from ``distillery.load_student``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch.testing import assert_close
from transformers import (
    AutoConfig,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    BertForQuestionAnswering,
    BertForSequenceClassification,
)

import distillery
from tests.helpers import TINY_BERT, tiny_bert_config

VOCAB, NUM_LABELS, BSZ, SEQ = TINY_BERT["vocab_size"], 3, 3, 11
TOL = dict(atol=1e-5, rtol=1e-5)
AUTO = {"classification": AutoModelForSequenceClassification, "qa": AutoModelForQuestionAnswering}


def tiny_bert(head: str, layers: int = 2):
    """transformers' tiny test config (hidden 32, 4 heads, intermediate 37, vocab 99), non-zero biases."""
    torch.manual_seed(0)
    cls = BertForSequenceClassification if head == "classification" else BertForQuestionAnswering
    config = tiny_bert_config(num_hidden_layers=layers, max_position_embeddings=64,
                              num_labels=NUM_LABELS if head == "classification" else 2)
    model = cls(config).eval()
    with torch.no_grad():  # a bias lost on the way through save/load would show
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return model


def build_distill(head):
    from distillery.baseline import build_student

    return build_student(tiny_bert(head, layers=4), [0, 2])


def build_moebert(head):
    from distillery.moebert.convert import convert

    importance = torch.rand(2, 37, generator=torch.Generator().manual_seed(1))
    return convert(tiny_bert(head), importance, num_experts=4, expert_size=9, shared_size=3)


def build_cmow(head):
    from distillery.cmow.modeling_cmow import CMOWConfig, CMOWForSequenceClassification

    torch.manual_seed(0)
    config = CMOWConfig(vocab_size=VOCAB, matrix_dim=4, vector_dim=16, head_hidden=8, sep_token_id=3,
                        init_std=0.1, num_labels=NUM_LABELS)
    return CMOWForSequenceClassification(config)


def build_autotinybert(head):
    from distillery.autotinybert.space import Arch
    from distillery.autotinybert.supernet import SuperNet

    net = SuperNet.from_teacher(tiny_bert(head, layers=3), "head-dims")
    return net.extract(Arch(2, 32, 37, 4, 16))  # fewer layers and a narrower attention than the teacher


BUILDERS = {"distill": build_distill, "moebert": build_moebert, "cmow": build_cmow, "autotinybert": build_autotinybert}
MODEL_TYPE = {"distill": "bert", "moebert": "moebert", "cmow": "cmow", "autotinybert": "autotinybert"}
CASES = [("distill", "classification"), ("distill", "qa"), ("moebert", "classification"), ("moebert", "qa"),
         ("cmow", "classification"), ("autotinybert", "classification"), ("autotinybert", "qa")]
IDS = [f"{kind}-{head}" for kind, head in CASES]


def inputs():
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(5, VOCAB, (BSZ, SEQ), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # one padded row
    ids[1, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def outputs(model, head) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(**inputs())
    return [out.logits] if head == "classification" else [out.start_logits, out.end_logits]


def assert_same_outputs(a, b, head):
    for x, y in zip(outputs(a, head), outputs(b, head), strict=True):
        assert_close(x, y, **TOL)


@pytest.fixture(params=CASES, ids=IDS)
def saved(request, tmp_path):
    """(kind, head, model, folder): a tiny student of each type, saved with ``save_pretrained``."""
    kind, head = request.param
    model = BUILDERS[kind](head).eval()
    model.save_pretrained(tmp_path)
    return kind, head, model, tmp_path


def test_output_shapes(saved):
    _, head, model, _ = saved
    shapes = [tuple(t.shape) for t in outputs(model, head)]
    assert shapes == ([(BSZ, NUM_LABELS)] if head == "classification" else [(BSZ, SEQ), (BSZ, SEQ)])


def test_save_load_equal(saved):
    _, head, model, folder = saved
    loaded = type(model).from_pretrained(folder).eval()
    assert_same_outputs(loaded, model, head)


def test_config_model_type(saved):
    kind, _, model, folder = saved
    assert model.config.model_type == MODEL_TYPE[kind]
    assert json.loads((folder / "config.json").read_text())["model_type"] == MODEL_TYPE[kind]


def test_safetensors_only(saved):
    *_, folder = saved
    assert (folder / "model.safetensors").is_file()
    assert not [p.name for p in folder.iterdir() if p.suffix in {".bin", ".pt", ".pth", ".pkl", ".ckpt"}]


def test_auto_classes_round_trip(saved):
    kind, head, model, folder = saved
    distillery.register_models()
    config = AutoConfig.from_pretrained(folder)
    assert type(config) is type(model.config) and config.model_type == MODEL_TYPE[kind]
    loaded = AUTO[head].from_pretrained(folder).eval()
    assert type(loaded) is type(model)
    assert_same_outputs(loaded, model, head)


def test_load_student_equal_from_the_folder_and_from_a_run_folder(saved, tmp_path_factory):
    _, head, model, folder = saved
    loaded = distillery.load_student(folder)
    assert type(loaded) is type(model) and not loaded.training
    assert_same_outputs(loaded, model, head)
    run = tmp_path_factory.mktemp("run")  # a run folder holds its student in student/
    model.save_pretrained(run / "student")
    assert_same_outputs(distillery.load_student(run), model, head)


def test_register_models_is_all_the_auto_classes_need():
    """In a fresh interpreter: ``import distillery`` then ``register_models()`` (load_student calls it
    by itself) makes every student type known to AutoConfig and the Auto heads it has."""
    code = (
        "import distillery\n"
        "from transformers import AutoConfig, AutoModelForQuestionAnswering as QA, AutoModelForSequenceClassification as SC\n"
        "distillery.register_models()\n"
        "for t in ('moebert', 'cmow', 'autotinybert'):\n"
        "    c = AutoConfig.for_model(t)\n"
        "    assert type(c) in SC._model_mapping, t\n"
        "    assert (type(c) in QA._model_mapping) == (t != 'cmow'), t\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
