"""predict / score on tiny models and tiny data."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from transformers import AutoModelForQuestionAnswering, AutoModelForSequenceClassification, AutoTokenizer

from distillery.config import DataConfig
from distillery.data import get_task, prepare_task_data
from distillery.errors import DistilleryError
from distillery.evaluation import predict, score
from distillery.metrics import compute_metrics
from tests.helpers import write_glue

datasets.disable_progress_bars()

SST2 = "sentence\tlabel\n" + "".join(
    f"{s}\t{y}\n" for s, y in [("a great movie", 1), ("boring film", 0), ("very fun plot", 1), ("awful actor", 0),
                               ("not good", 0), ("really great fun", 1), ("bad", 0)]
)
STSB = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n" + "".join(
    f"{i}\tm\tx\t2012\t{i}\tnone\tnone\t{a}\t{b}\t{s}\n"
    for i, (a, b, s) in enumerate([("a movie", "a film", 4.5), ("paris", "london", 0.5), ("good", "great", 3.0)])
)
CONTEXT = "paris is a city in france . it was first named lutetia ."


def squad_v2() -> dict:
    qas = [
        {"question": "where is paris ?", "id": "a", "is_impossible": False,
         "answers": [{"text": "france", "answer_start": CONTEXT.index("france")}]},
        {"question": "who was born in paris ?", "id": "b", "is_impossible": True, "answers": []},
    ]
    return {"version": "v2.0", "data": [{"title": "Paris", "paragraphs": [{"context": CONTEXT, "qas": qas}]}]}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    for name, text in (("SST-2", SST2), ("STS-B", STSB)):
        (root / "glue" / name).mkdir(parents=True)
        (root / "glue" / name / "train.tsv").write_text(text)
        (root / "glue" / name / "dev.tsv").write_text(text)
    (root / "squad").mkdir()
    (root / "squad" / "dev-v2.0.json").write_text(json.dumps(squad_v2()))
    return root


def cfg(data_dir, **kw) -> DataConfig:
    return DataConfig(data_dir=str(data_dir), max_length=kw.pop("max_length", 32), doc_stride=8, **kw)


@pytest.fixture(scope="module")
def tokenizer(tiny_bert):
    return AutoTokenizer.from_pretrained(tiny_bert)


def test_score_classification(tiny_bert, tokenizer, data_dir):
    task = get_task("sst2")
    task_data = prepare_task_data(task, tokenizer, cfg(data_dir))
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    model.train()
    logits = predict(model, task_data, batch_size=3)
    assert logits.shape == (7, 2) and logits.dtype == np.float32
    assert model.training  # predict restores the caller's mode
    # Dynamic padding must not change any example's logits.
    np.testing.assert_allclose(predict(model, task_data, batch_size=1), logits, atol=1e-5)
    metrics = score(model, task_data, batch_size=4)
    assert set(metrics) == {"accuracy"} and task.main_metric in metrics
    assert metrics == compute_metrics(task, logits.argmax(-1), task_data.dev["labels"])
    assert predict(model, task_data, split="train").shape == (7, 2)


def test_score_regression(tiny_bert, tokenizer, data_dir):
    task_data = prepare_task_data(get_task("stsb"), tokenizer, cfg(data_dir))
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=1)
    assert predict(model, task_data).shape == (3,)
    metrics = score(model, task_data)
    assert set(metrics) == {"pearson", "spearman"} and all(np.isfinite(v) for v in metrics.values())


def test_score_squad_v2(tiny_bert, tokenizer, data_dir):
    task = get_task("squad_v2")
    task_data = prepare_task_data(task, tokenizer, cfg(data_dir, max_length=24), splits=("dev",))
    model = AutoModelForQuestionAnswering.from_pretrained(tiny_bert)
    start, end = predict(model, task_data, batch_size=2)
    assert start.shape == end.shape == (len(task_data.dev), max(len(x) for x in task_data.dev["input_ids"]))
    metrics = score(model, task_data, batch_size=2)
    assert task.main_metric in metrics and {"exact_match", "HasAns_f1", "NoAns_f1"} <= set(metrics)
    assert all(0.0 <= v <= 100.0 for v in metrics.values())


def test_score_uses_the_models_device_and_inference_mode(tiny_bert, tokenizer, data_dir):
    task_data = prepare_task_data(get_task("sst2"), tokenizer, cfg(data_dir), splits=("dev",))
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    seen = {}

    def hook(module, args, kwargs):
        seen["grad"] = torch.is_grad_enabled()
        seen["device"] = kwargs["input_ids"].device
        seen["keys"] = set(kwargs)

    model.register_forward_pre_hook(hook, with_kwargs=True)
    predict(model, task_data)
    assert seen == {"grad": False, "device": torch.device("cpu"), "keys": {"input_ids", "attention_mask", "token_type_ids"}}


def test_score_needs_a_dev_split(tiny_bert, tokenizer, data_dir):
    task_data = prepare_task_data(get_task("sst2"), tokenizer, cfg(data_dir), splits=("train",))
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    with pytest.raises(DistilleryError, match="No dev split"):
        score(model, task_data)


def test_public_evaluate_scores_a_saved_model_folder(tmp_path, tiny_bert):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    import distillery
    write_glue(tmp_path / "data", n_train=8, n_dev=10)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    model.save_pretrained(tmp_path / "m")
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(tmp_path / "m")
    result = distillery.evaluate(str(tmp_path / "m"), "sst2", data_dir=str(tmp_path / "data"))
    assert result["task"] == "sst2" and result["examples"] == 10
    assert 0.0 <= result["metrics"]["accuracy"] <= 1.0
    with pytest.raises(DistilleryError, match="tokenizer"):
        distillery.evaluate(model, "sst2", data_dir=str(tmp_path / "data"))


def test_length_sorted_predict_equals_one_example_at_a_time(tiny_bert, tokenizer, data_dir):
    """predict batches longest-first; the slow reference runs each example alone, unpadded."""
    task = get_task("sst2")
    data = prepare_task_data(task, tokenizer, cfg(data_dir))
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2).eval()
    fast = predict(model, data, batch_size=3, split="train")
    with torch.no_grad():
        slow = np.stack([
            model(**{k: torch.tensor([data.train[i][k]]) for k in ("input_ids", "attention_mask", "token_type_ids")})
            .logits[0].numpy()
            for i in range(len(data.train))
        ])
    np.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind, metrics, main, match", [
    ("qa", ("accuracy",), "accuracy", "'accuracy' that a qa task is not scored with"),
    ("regression", ("pearson", "f1"), "pearson", "'f1' that a regression task is not scored with"),
    ("qa", ("exact_match", "f1", "NoAns_f1"), "NoAns_f1", "not given for every dev set of a qa task"),
])
def test_a_task_scored_with_metrics_its_kind_has_not_is_refused_when_made(kind, metrics, main, match):
    """A TaskSpec given to evaluate() is user input: a metric its kind is not scored with (or a main metric
    some dev sets lack) is a sentence when the spec is made, not an error after the predictions."""
    from distillery.data.tasks import TaskSpec

    with pytest.raises(DistilleryError, match=match):
        TaskSpec(name="mine", kind=kind, labels=None, metrics=metrics, main_metric=main)


def _saved(tiny_bert, folder, labels: dict | None = None, task: str | None = None):
    """The tiny BERT with a head of ``labels`` (id -> name; None: a regression head) saved in ``folder``, recording
    that it was trained for ``task`` (None: nothing recorded)."""
    from distillery.modeling import FINETUNING_TASK

    kwargs = {"num_labels": 1, "problem_type": "regression"} if labels is None else \
        {"num_labels": len(labels), "id2label": labels, "label2id": {v: k for k, v in labels.items()}}
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, **kwargs)
    if task:
        setattr(model.config, FINETUNING_TASK, task)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(folder)
    return folder


def test_a_model_is_scored_on_the_task_it_was_trained_for_unless_told_otherwise(tiny_bert, tmp_path, monkeypatch,
                                                                                 capsys):
    """Issue 52: `eval RUN --task mrpc` on an SST-2 student scored an F1 without a word."""
    import yaml

    from tests.helpers import assert_one_line_error, run_cli

    data = write_glue(tmp_path / "data", n_train=8, n_dev=10)
    nli = _saved(tiny_bert, tmp_path / "rte", {0: "entailment", 1: "not_entailment"}, task="rte")

    def evaluate(*args):
        return run_cli(monkeypatch, capsys, "eval", *map(str, args), "--data-dir", str(data))

    code, _, err = evaluate(nli, "--task", "sst2")
    assert_one_line_error(code, err, f"{nli} was trained for rte ({nli / 'config.json'} records it) with labels "
                                     "entailment, not_entailment, and --task sst2 has labels negative, positive: its "
                                     "scores there would mean nothing. Give --task rte, or add --other-task to score it "
                                     "on sst2 all the same.")
    code, out, err = evaluate(nli, "--task", "sst2", "--other-task")  # as many outputs: asked for, scored
    assert code == 0, err
    assert json.loads(out)["task"] == "sst2"
    code, _, err = evaluate(nli, "--task", "stsb", "--other-task")  # another number of outputs: never
    assert_one_line_error(code, err, "and --task stsb has a regression head, another number of outputs: its scores "
                                     "there would mean nothing. Give --task rte.")
    # without --task, the model's own task (STS-B here, whose data the folder has)
    code, out, err = evaluate(_saved(tiny_bert, tmp_path / "stsb", None, task="stsb"))
    assert code == 0, err
    assert json.loads(out)["task"] == "stsb"
    # a run older than the recorded key: its config.yaml says which task its student learned
    run = tmp_path / "run"
    _saved(tiny_bert, run / "student", {0: "not_equivalent", 1: "equivalent"})
    (run / "config.yaml").write_text(yaml.safe_dump({"method": "distill", "data": {"task": "mrpc"}}))
    code, _, err = evaluate(run, "--task", "sst2")
    assert_one_line_error(code, err, f"was trained for mrpc (its run's {run / 'config.yaml'} says so) with labels "
                                     "not_equivalent, equivalent")
    # a model that records no task is scored on the task given
    code, out, err = evaluate(_saved(tiny_bert, tmp_path / "plain", {0: "0", 1: "1"}), "--task", "sst2")
    assert code == 0, err


def test_export_scores_a_model_on_the_task_it_was_trained_for_unless_told_otherwise(tiny_bert, tmp_path, monkeypatch,
                                                                                    capsys):
    """Issue 52: `export MODEL --task OTHER` scored the export on another task's labels without a word."""
    from tests.helpers import assert_one_line_error, run_cli

    data = write_glue(tmp_path / "data", n_train=8, n_dev=10)
    nli = _saved(tiny_bert, tmp_path / "rte", {0: "entailment", 1: "not_entailment"}, task="rte")

    def export(*args):
        return run_cli(monkeypatch, capsys, "export", str(nli), "--format", "torch-int8", "--data-dir", str(data),
                       "--dev-limit", "4", *args)

    code, _, err = export("--task", "sst2", "--out", str(tmp_path / "x"))
    assert_one_line_error(code, err, f"{nli} was trained for rte ({nli / 'config.json'} records it) with labels "
                                     "entailment, not_entailment, and --task sst2 has labels negative, positive")
    assert not (tmp_path / "x").exists()
    code, out, err = export("--task", "sst2", "--other-task", "--out", str(tmp_path / "y"))
    assert code == 0, err
    assert '"task": "sst2"' in out
