"""benchmarks/auto.py's line for an auto run on another task or speed-up (issue 53; a synthetic summary)."""

from __future__ import annotations

import pytest

from tests.helpers import benchmark_script


@pytest.fixture(scope="module")
def bench():
    with benchmark_script("auto") as module:
        yield module


def point(name, score, speedup, meets):
    return {"point": name, "score": score, "speedup": speedup, "meets_target": meets}


def test_a_task_line_says_the_choice_what_it_keeps_and_the_int8_exports_that_reach_the_target(bench):
    summary = {"task": "rte", "target": {"speedup": 4.0}, "seconds": 2400.0,
               "baselines": [{"model": "teacher", "score": 0.6}, {"model": "teacher-int8", "score": 0.59}],
               "candidates": [
                   {"status": "trained", "points": [point("prune", 0.58, 3.9, False), point("prune+onnx-int8", 0.57, 5.4, True)]},
                   {"status": "trained", "points": [point("distill-3l", 0.59, 2.0, False),
                                                    point("distill-3l+onnx-int8", 0.585, 4.7, True)]},
                   {"status": "skipped"}],
               "chosen": point("distill-3l+onnx-int8", 0.585, 4.7, True)}
    line = bench.task_line(summary)
    assert line.startswith("| rte | 4× | 0.6000 | `distill-3l+onnx-int8` | 0.5850 | 97.5 % | 4.70× |")
    assert "`prune+onnx-int8` (5.40×), `distill-3l+onnx-int8` (4.70×)" in line and line.endswith("| 2 | 40 min |")
    assert "| none |" in bench.task_line({**summary, "chosen": None})
