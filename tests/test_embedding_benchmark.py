"""benchmarks/embedding.py's table for a base-size teacher: its 4x point against all-MiniLM-L6-v2 as it is
(synthetic records: nothing is run)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import benchmark_script


@pytest.fixture()
def bench(tmp_path, monkeypatch):
    with benchmark_script("embedding") as module:
        monkeypatch.setattr(module, "RESULTS", tmp_path)
        yield module


def point(model, sts, mrr, throughput, baseline=False):
    return {"model": model, "baseline": baseline, "speedup": {"latency": throughput, "throughput": throughput},
            "sts_spearman": sts, "sts_retention": sts / 0.88, "mrr_at_10": mrr, "mrr_at_10_retention": mrr / 0.80,
            "recall_at_1": 0.6, "recall_at_10": 0.9}


def record(name, points, teacher="mpnet-base"):
    return {"point": name, "method": "distill", "seed": 42, "teacher": teacher, "budget": "quick", "dev_limit": 1500,
            "teacher_scores": {"sts_spearman": 0.88, "mrr_at_10": 0.80, "recall_at_1": 0.7, "recall_at_10": 0.95},
            "points": points, "transfer_text": {"file": "t.jsonl", "texts": 10, "source": "ten"}, "max_length": 128,
            "student_epochs": 1.0, "student_lr": 5e-4, "train_seconds": 1.0, "hardware": {"cpu": "x", "threads": 2},
            "noise": {"stable": True}}


def test_a_base_size_teachers_4x_point_is_set_against_minilm_as_it_is(bench, tmp_path):
    shelf = record("distill-3of6", [], teacher="minilm")
    shelf["teacher_scores"] = {"sts_spearman": 0.8672, "mrr_at_10": 0.7389}
    (tmp_path / "embedding-minilm.json").write_text(json.dumps([shelf]))
    records = [record("distill-3of12", [point("student", 0.85, 0.70, 3.9), point("student-onnx-int8", 0.849, 0.699, 9.0),
                                        point("teacher-int8", 0.879, 0.79, 2.5, baseline=True)])]
    text = bench.table(records)
    assert "Teacher mpnet-base (all-mpnet-base-v2, not fine-tuned)" in text
    assert "all-MiniLM-L6-v2 as it is (off the shelf, embedding-minilm.json): STS-B Spearman 0.8672, MRR@10 0.7389" in text
    # the best of the two by its smaller margin: the fp32 student (-0.0172, -0.0389)
    assert "best `distill-3of12` (`student`) at 3.90×: STS-B 0.8500 (-0.0172), MRR@10 0.7000 (-0.0389)" in text
    assert "Asked: better on both: NOT met." in text
    records[0]["points"][0].update(sts_spearman=0.87, mrr_at_10=0.75)
    assert "Asked: better on both: met." in bench.table(records)


def test_without_minilm_on_the_same_dev_rows_the_comparison_says_so(bench):
    text = bench.table([record("distill-3of12", [point("student", 0.85, 0.70, 3.9)])])
    assert "not measured on these dev rows (no embedding-minilm.json record)" in text


def test_held_out_retention_is_the_share_of_the_teacher_s_scores_with_a_paired_interval():
    """benchmarks/embedding_heldout.py's --against: the same rows for teacher and model, a model equal to the teacher
    keeps 100 % with no spread, and a model worse on every question has an interval wholly under 100 %."""
    import numpy as np

    with benchmark_script("embedding_heldout") as module:
        rng = np.random.default_rng(0)
        gold = rng.uniform(0, 5, 300)
        teacher = {"cosines": gold + rng.normal(0, 1, 300), "ranks": rng.integers(1, 4, 400)}
        same = module.retention(teacher, teacher, gold)
        assert same["mrr_at_10_retention"] == 1.0 and same["mrr_at_10_retention_95"] == pytest.approx([1.0, 1.0])
        assert same["sts_spearman_retention"] == pytest.approx(1.0)
        assert same["sts_spearman_retention_95"] == pytest.approx([1.0, 1.0])
        worse = {"cosines": teacher["cosines"] + rng.normal(0, 2, 300), "ranks": teacher["ranks"] + 1}
        got = module.retention(worse, teacher, gold)
        rr = lambda ranks: np.where(ranks <= 10, 1.0 / ranks, 0.0).mean()  # noqa: E731
        assert got["mrr_at_10_retention"] == pytest.approx(rr(worse["ranks"]) / rr(teacher["ranks"]))
        assert got["mrr_at_10_retention_95"][0] < got["mrr_at_10_retention"] < got["mrr_at_10_retention_95"][1] < 1.0
        assert got["sts_spearman_retention_95"][1] < 1.0
        assert module.scores(teacher, gold)["mrr_at_10"] == pytest.approx(rr(teacher["ranks"]))


def test_held_out_cosines_to_the_teacher_by_form_of_text():
    """benchmarks/embedding_heldout.py's drift measure: the teacher against itself is at 1 on every form; a model whose
    question vectors are turned away from the teacher's is lower there and nowhere else."""
    import numpy as np

    with benchmark_script("embedding_heldout") as module:
        rng = np.random.default_rng(1)
        teacher = {"vectors": {form: rng.normal(size=(20, 8)) for form in ("sts_sentences", "questions", "paragraphs")}}
        assert module.cosines_to_teacher(teacher, teacher) == pytest.approx(
            {"sts_sentences": 1.0, "questions": 1.0, "paragraphs": 1.0})
        drifted = {"vectors": {**teacher["vectors"],
                               "questions": teacher["vectors"]["questions"] + rng.normal(size=(20, 8))}}
        got = module.cosines_to_teacher(drifted, teacher)
        assert got["questions"] < 0.9 and got["sts_sentences"] == pytest.approx(1.0)


def test_held_out_questions_are_a_range_past_the_dev_rows():
    """benchmarks/embedding_heldout.py's --squad-questions: START:END past the benchmark's 1,500 dev questions;
    anything else is refused with what to give."""
    import argparse

    with benchmark_script("embedding_heldout") as module:
        assert module.question_range("4500:10570") == range(4500, 10570)
        for bad, words in (("3000", "START:END"), ("a:b", "START:END"), ("0:1500", "1500 or more"),
                           ("5000:4000", "below END")):
            with pytest.raises(argparse.ArgumentTypeError, match=words):
                module.question_range(bad)
