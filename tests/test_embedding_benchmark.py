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
