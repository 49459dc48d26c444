"""Metrics against hand-computed values."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from distillery.data.tasks import TaskSpec, get_task
from distillery.metrics import compute_metrics, normalize_answer, squad_metrics

CUSTOM3 = TaskSpec(name="custom", kind="classification", labels=("a", "b", "c"),
                   metrics=("accuracy", "macro_f1"), main_metric="accuracy")


def test_binary_classification_metrics():
    preds, labels = [1, 0, 1, 1], [1, 0, 0, 1]  # tp 2, tn 1, fp 1, fn 0
    m = compute_metrics(get_task("mrpc"), preds, labels)
    assert m == pytest.approx({"f1": 0.8, "accuracy": 0.75})  # p 2/3, r 1
    mcc = compute_metrics(get_task("cola"), np.array(preds), np.array(labels))
    assert mcc == pytest.approx({"mcc": 2 / np.sqrt(12)})  # (2*1 - 1*0) / sqrt(3*2*2*1)
    assert all(isinstance(v, float) for v in m.values())


def test_macro_f1_for_custom_multiclass():
    m = compute_metrics(CUSTOM3, [0, 1, 2, 2], [0, 1, 1, 2])
    # per class F1: 1, 2/3 (p 1, r 1/2), 2/3 (p 1/2, r 1)
    assert m == pytest.approx({"accuracy": 0.75, "macro_f1": 7 / 9})


def test_regression_correlations():
    m = compute_metrics(get_task("stsb"), np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0]))
    assert m["pearson"] == pytest.approx(3 / np.sqrt(2 * 42 / 9))
    assert m["spearman"] == pytest.approx(1.0)


def test_degenerate_predictions_give_zero_not_nan_and_no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compute_metrics(get_task("stsb"), [2.5, 2.5, 2.5], [1.0, 2.0, 4.0]) == {"pearson": 0.0, "spearman": 0.0}
        assert compute_metrics(get_task("cola"), [1, 1, 1], [0, 1, 1]) == {"mcc": 0.0}
        assert compute_metrics(get_task("mrpc"), [0, 0, 0], [0, 1, 1]) == pytest.approx({"f1": 0.0, "accuracy": 1 / 3})
        assert compute_metrics(get_task("stsb"), [1.0], [2.0]) == {"pearson": 0.0, "spearman": 0.0}


def test_length_mismatch_is_a_bug():
    with pytest.raises(ValueError):
        compute_metrics(get_task("sst2"), [1, 0], [1])


def test_normalize_answer_official_rules():
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words


def ex(qid, *answers):
    return {"id": qid, "answers": {"text": list(answers), "answer_start": [0] * len(answers)}}


def test_squad_v1_em_and_f1():
    examples = [ex("q1", "Eiffel Tower", "tower"), ex("q2", "Paris"), ex("q3", "1889")]
    preds = {"q1": "the Eiffel Tower", "q2": "in Paris France"}  # q3 unanswered: scores 0
    m = squad_metrics(preds, examples, version_2=False)
    # q1: EM 1, F1 1; q2: EM 0, F1 = 2 * (1/3 * 1) / (1/3 + 1) = 0.5; q3: 0
    assert m == pytest.approx({"exact_match": 100 / 3, "f1": 150 / 3})


def test_squad_v2_breakdown():
    examples = [ex("q1", "Eiffel Tower"), ex("q2", "Paris"), ex("q3"), ex("q4")]
    preds = {"q1": "Eiffel Tower", "q2": "in Paris France", "q3": "", "q4": "something"}
    m = squad_metrics(preds, examples, version_2=True)
    assert m == pytest.approx({
        "exact_match": 50.0, "f1": 62.5,
        "HasAns_exact": 50.0, "HasAns_f1": 75.0,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0,
    })
    answerable_only = squad_metrics({"q1": "eiffel tower"}, examples[:1], version_2=True)
    assert answerable_only == {"exact_match": 100.0, "f1": 100.0, "HasAns_exact": 100.0, "HasAns_f1": 100.0}
