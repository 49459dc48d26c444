"""benchmarks/prune.py's comparison with the other students' records (synthetic records: nothing is run)."""

from __future__ import annotations

import pytest

from tests.helpers import benchmark_script


@pytest.fixture(scope="module")
def bench():
    with benchmark_script("prune") as module:
        yield module


def run_record(method, task, score, speedup, **more):
    return {"method": method, "task": task, "budget": "quick", "main_metric": "pearson", "hardware": {"cpu": "x"},
            "metrics": {"student": {"pearson": score}}, "speedup": {"latency": speedup}, **more}


def test_every_kind_of_record_gives_its_points_and_others_are_left_out(bench):
    records = [
        run_record("distill", "stsb", 0.81, 1.9),
        run_record("autotinybert speedup=4", "stsb", 0.78, 3.8),
        run_record("distill", "mrpc", 0.85, 1.9),  # another task
        run_record("distill", "stsb", 0.9, 8.0, budget="full"),  # another budget
        run_record("distill", "stsb", 0.9, 8.0, teacher_name="mpnet-base"),  # another teacher
        run_record("teacher", "stsb", 0.85, 1.0, variant="teacher"),  # the teacher is no student
        {"ablation": "deep-cut", "task": "stsb", "budget": "quick", "teacher": "minilm", "student_layers": 2,
         "defaults": "new", "seed": 42, "score": 0.78, "speedup": 2.9,
         "int8": {"model": "student-onnx-int8", "score": 0.779, "speedup": 5.6}},
        {"ablation": "augment-4x", "method": "distill", "task": "stsb", "budget": "quick", "teacher": "minilm",
         "points": [{"model": "student", "score": 0.8, "speedup": 2.0}, {"model": "student-onnx-int8", "score": 0.79,
                                                                         "speedup": 4.3}]},
        {"ablation": "prune", "method": "prune", "task": "stsb", "budget": "quick", "score": 1.0, "speedup": 9.0},
    ]
    sources = {id(r): f"file{i}.json" for i, r in enumerate(records)}
    points = bench.other_points(records, "stsb", "minilm", "quick", sources)
    assert sorted((p["score"], p["speedup"]) for p in points) == [
        (0.779, 5.6), (0.78, 2.9), (0.78, 3.8), (0.79, 4.3), (0.8, 2.0), (0.81, 1.9)]
    assert {p["source"] for p in points} == {"file0.json", "file1.json", "file6.json", "file7.json"}

    ours = [{"model": "student", "score": 0.785, "speedup": 4.1},
            {"model": "student-onnx-int8", "score": 0.78, "speedup": 7.9}]
    verdict = bench.compare(ours, points)
    assert verdict["beats_every_student_at_speed"]  # nothing as fast (5.6x at most) is more accurate
    worse = bench.compare([{"model": "student", "score": 0.77, "speedup": 4.0}], points)
    assert not worse["beats_every_student_at_speed"]
    assert [(o["score"], o["speedup"]) for o in worse["verdicts"]["student"]["beaten_by"]] == [(0.779, 5.6), (0.79, 4.3)]


def test_the_table_says_whether_each_target_was_met(bench):
    rec = {"task": "stsb", "mode": "full", "target_speedup": 4.0, "seed": 42, "speedup": 4.3, "predicted_speedup": 4.0,
           "masks_expected_speedup": 1.5, "teacher_score": 0.85, "score": 0.8, "retention": 0.94,
           "int8": {"score": 0.79, "speedup": 7.5, "retention": 0.93}, "beats_every_student_at_speed": True,
           "compared_against": [{"method": "distill", "model": "student", "score": 0.81, "speedup": 1.9,
                                 "source": "distill-quick.json"}],
           "hardware": {"cpu": "x", "cores": 2, "threads": 2}, "teacher": "minilm", "budget": "quick"}
    far = {**rec, "target_speedup": 8.0, "speedup": 5.0, "beats_every_student_at_speed": False}
    text = bench.table([rec, far])
    assert "| stsb | full | 4× | budget's (before the rule) | 4.30× | 4.00× | 1.50× |" in text and "none at ≥ 4.30×" in text
    rec["notes"] = ["Defaults for a model pruned to 4x (as deep a cut as a layer-drop student of 2 of 6 layers): T = 1."]
    assert "| stsb | full | 4× | deep-cut rule | 4.30× |" in bench.table([rec])
    assert "| 0.8100 at 1.90× (student) | — |" in text  # the layer-drop student nearest in speed; no AutoTinyBERT
    assert "1 of 2 runs (stsb 4× → 4.30×; stsb 8× → 5.00×)" in text
    assert "at 4×: at least as accurate as every student at least as fast on 1 of 1" in text
    assert "at 8×: at least as accurate as every student at least as fast on 0 of 1" in text


def test_the_readme_summary_shows_prune_s_full_mode_rows(tmp_path):
    """The README's SST-2 table holds prune beside the other methods: its full-mode SST-2 records (params and
    throughput kept), by target; cheap mode, other tasks and records without params are left out."""
    import json

    with benchmark_script("common") as common:
        hardware = {"cpu": "x", "cores": 2, "threads": 2, "torch": "2.13.0+cpu", "gpu": None}
        prune = {"task": "sst2", "mode": "full", "seed": 42, "score": 0.883, "retention": 1.009, "speedup": 3.89,
                 "throughput_speedup": 4.2, "params": 14.1e6, "hardware": {**hardware, "cpu": "y"}}
        path = tmp_path / "prune-minilm-quick.json"
        path.write_text(json.dumps([{**prune, "target_speedup": 4.0}, {**prune, "target_speedup": 2.0, "score": 0.9},
                                    {**prune, "target_speedup": 8.0, "mode": "cheap"},
                                    {**prune, "target_speedup": 8.0, "task": "rte"},
                                    {k: v for k, v in {**prune, "target_speedup": 8.0}.items() if k != "params"}]))
        rows = common.prune_summary_rows(path)
        assert [(r["label"], r["accuracy"]) for r in rows] == [("prune speedup=2", 0.9), ("prune speedup=4", 0.883)]
        distill = {"method": "distill", "task": "sst2", "budget": "quick", "retention": 0.98, "hardware": hardware,
                   "metrics": {"teacher": {"accuracy": 0.875}, "student": {"accuracy": 0.861}},
                   "models": {"teacher": {"params": 22.7e6}, "student": {"params": 17.4e6}},
                   "speedup": {"latency": 1.91, "throughput": 1.97}}
        table = common.summary_table([distill], rows)
        assert "| `prune speedup=4` | 0.883 | 100.9 % | 14.1M | 3.89× | 4.20× |" in table
        assert table.index("`distill train_examples=budget`") < table.index("`prune speedup=2`")
        assert "y for `prune speedup=2`, `prune speedup=4`" in table  # measured on another machine: said
