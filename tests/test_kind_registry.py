"""Adding a task kind is adding its module and a registry line: the toy kind of tests/toy_kind.py, registered by one
line in ``KINDS``, is a kind a task can name, is checked against its metrics, and runs through ``distillery.compress``
(teacher fine-tuning, distillation, scoring, the report and the card) with nothing else edited."""

import dataclasses
import json

import pytest

from distillery.errors import DistilleryError
from tests.helpers import tiny_config

TOY = "tests.toy_kind:AbsoluteScore"


@pytest.fixture
def toy(monkeypatch):
    from distillery.data.tasks import TASKS
    from distillery.kinds import KINDS

    monkeypatch.setitem(KINDS, "toy", TOY)  # the one line
    # a task of the toy kind: STS-B's files and metrics
    monkeypatch.setitem(TASKS, "toysts", dataclasses.replace(TASKS["stsb"], name="toysts", kind="toy"))
    yield "toysts"


def test_a_registered_kind_is_a_kind_a_task_can_name(toy):
    from distillery.data.tasks import TaskSpec, get_task
    from distillery.kinds import kind_of

    kind = get_task(toy).kind_object
    assert kind is kind_of("toy") and kind.name == "toy" and get_task(toy).num_labels == 1
    with pytest.raises(DistilleryError, match="'accuracy' that a toy task is not scored with; use pearson, spearman"):
        TaskSpec(name="mine", kind="toy", labels=None, metrics=("accuracy",), main_metric="accuracy")
    with pytest.raises(DistilleryError, match="unknown kind 'tagging'; use one of classification, regression, qa, token_classification, embedding, toy"):
        TaskSpec(name="mine", kind="tagging", labels=None, metrics=("f1",), main_metric="f1")


def test_a_registered_kind_runs_through_compress(toy, tiny_bert, glue_dir, tmp_path):
    import distillery
    from tests.toy_kind import CALLS

    CALLS.clear()
    out = distillery.compress(tiny_config(tiny_bert, glue_dir, tmp_path / "run", task=toy))
    student = distillery.load_student(out)
    assert student.config.num_labels == 1 and student.config.problem_type == "regression"  # the toy's head
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == toy and metrics["main_metric"] == "pearson"
    assert set(metrics["student"]) == {"pearson", "spearman"} and metrics["chance"]["predictor"] == "a constant"
    # the teacher and the student were trained on its loss and distillation term, and scored from its predictions
    assert CALLS["task_loss"] and CALLS["distillation_term"] and CALLS["predictions"]
    assert "pipeline_tag: text-classification" in (out / "student" / "README.md").read_text()
