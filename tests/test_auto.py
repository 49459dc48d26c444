"""``compress --method auto``: the plan (depths, MoEBERT's reach, cheapest first), the choice, the time
budget, plain sentences for bad input, and the whole thing end to end on the tiny teacher, resumed."""

import json
import time

import pytest
import yaml

from distillery.auto import (Candidate, choose, distill_depths, make_target, moebert_reach, parse_time_budget, plan,
                             route_options, run_candidates, Target)
from distillery.config import nested_settings
from distillery.errors import DistilleryError
from tests.helpers import TINY_RUN, assert_one_line_error, flop_timed, run_cli, run_ok


def test_time_budgets_and_targets_read_or_fail_with_a_sentence():
    assert parse_time_budget("30m") == 1800 and parse_time_budget("2h") == 7200
    assert parse_time_budget("1h30m") == 5400 and parse_time_budget("90s") == 90 and parse_time_budget("45") == 45
    assert parse_time_budget("1.5h") == 5400 and parse_time_budget(None) is None
    for bad in ("soon", "", "1h30", "0", "-5m", "2d"):
        with pytest.raises(DistilleryError, match="--time-budget"):
            parse_time_budget(bad)
    assert make_target(2, None) == Target(2.0, None)
    for speedup, latency, words in ((None, None, "needs a target"), (1.0, None, "above 1"), (0.5, None, "above 1"),
                                    (2.0, 5.0, "not both"), (None, 0.0, "above 0")):
        with pytest.raises(DistilleryError, match=words):
            make_target(speedup, latency)


def _bert(layers=12, hidden=768, ffn=3072):
    from transformers import BertConfig

    return BertConfig(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=ffn, num_attention_heads=12)


def test_plan_keeps_the_candidates_that_can_meet_the_target_cheapest_first():
    options = route_options({})
    # BERT-base at 128 tokens: MoEBERT with 4 experts of 768 neurons is at best (2·768+128+3072)/(2·768+128+768)
    bound, how = moebert_reach(_bert(), 128, {})
    assert bound == pytest.approx(4736 / 2432) and "3072" in how
    candidates, skipped = plan(_bert(), 2.0, 128, options)
    names = [c.name for c in candidates]
    assert names[0] == "cmow" and names[-1] == "autotinybert" and {"distill-6l", "distill-5l"} <= set(names)
    assert [s["name"] for s in skipped] == ["moebert"] and "1.95×" in skipped[0]["reason"]
    assert [c.cost for c in candidates] == sorted(c.cost for c in candidates)
    candidates, skipped = plan(_bert(), 1.5, 128, options)
    assert "moebert" in [c.name for c in candidates] and not skipped
    assert distill_depths(12, 2) == [6, 5] and distill_depths(2, 2) == [1] and distill_depths(12, 1.1) == [10, 9]


def test_options_go_to_the_methods_that_have_them():
    routed = route_options({"kd_weight": 0.7, "experts": 8})
    assert routed["distill"] == {"kd_weight": 0.7} and routed["moebert"] == {"experts": 8}
    assert routed["cmow"]["kd_weight"] == 0.7 and routed["autotinybert"]["kd_weight"] == 0.7
    with pytest.raises(DistilleryError, match="No method that auto tries has the option"):
        route_options({"wings": 2})
    with pytest.raises(DistilleryError, match="chooses student_layers itself"):
        route_options({"student_layers": 3})


def _point(name, score, ms, speedup):
    return {"point": name, "candidate": name, "model": "student", "main": score, "latency_ms": ms,
            "latency_speedup": speedup}


def test_the_chosen_model_is_the_most_accurate_that_meets_the_target_as_measured():
    points = [_point("deep", 0.90, 8.0, 1.5), _point("mid", 0.85, 5.0, 2.4), _point("fast", 0.80, 2.0, 6.0)]
    chosen, why = choose(points, Target(speedup=2.0), "accuracy")
    assert chosen["point"] == "mid"
    assert "`fast`" in why and "`deep`" in why and "misses the target" in why
    chosen, _ = choose(points, Target(latency_ms=2.5), "accuracy")
    assert chosen["point"] == "fast"
    chosen, why = choose(points, Target(speedup=10.0), "accuracy")
    assert chosen is None and why.startswith("No candidate meets") and "the fastest is `fast`" in why


def test_candidates_left_when_the_time_budget_is_spent_are_skipped_with_the_reason(tmp_path, monkeypatch):
    import distillery.pipeline

    ran = []
    monkeypatch.setattr(distillery.pipeline, "compress", lambda config, resume=False: (ran.append(config), time.sleep(0.05)))
    candidates = [Candidate(n, "distill", {}, i, "") for i, n in enumerate(("a", "b", "c"))]
    done, skipped = run_candidates(candidates, {c.name: c.name for c in candidates}, tmp_path, budget_s=0.01)
    assert ran == ["a"] and [r["name"] for r in done] == ["a"]  # the one started finishes
    assert [s["name"] for s in skipped] == ["b", "c"] and all("time budget" in s["reason"] for s in skipped)


def test_bad_auto_input_is_one_sentence(monkeypatch, capsys, tmp_path):
    out = str(tmp_path / "auto")
    for args, words in ((["--method", "auto"], "needs a target"),
                        (["--method", "auto", "--speedup", "1"], "--speedup must be above 1"),
                        (["--method", "auto", "--speedup", "2", "--time-budget", "soon"], "--time-budget must be"),
                        (["--method", "distill", "--latency-ms", "5"], "belong to --method auto"),
                        (["--method", "auto", "--speedup", "2", "--preset", "paper"], "--preset names one method")):
        code, _, err = run_cli(monkeypatch, capsys, "compress", "--out", out, *args)
        assert_one_line_error(code, err, words)
    assert not (tmp_path / "auto").exists()


# The tiny sizes of each method, as their own tests run them (a handful of steps, 1-2 timed runs).
TINY_OPTIONS = {"matrix_dim": 4, "vector_dim": 16, "importance_examples": 40, "supernet_steps": 3, "latency_archs": 8,
                "latency_runs": 1, "generations": 1, "population": 2, "proxy_examples": 16, "budget_floor": 0}


def _files(folder):
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.live_baselines
def test_auto_end_to_end_then_resumed(tiny_bert4, glue_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "cache"))
    flop_timed(monkeypatch)
    monkeypatch.setattr("distillery.bench.noise.machine_load", lambda: 64.0)  # a loaded machine: flagged, not hidden
    settings = tmp_path / "tiny.yaml"
    settings.write_text(yaml.safe_dump(nested_settings({**TINY_RUN, "student.epochs": 1.0, "teacher.train.epochs": 1.0})))
    out = tmp_path / "auto"
    options = [a for k, v in TINY_OPTIONS.items() for a in ("--option", f"{k}={v}")]
    common = ["compress", "--teacher", str(tiny_bert4), "--data-dir", str(glue_dir), "--out", str(out),
              "--config", str(settings), *options]
    shown = run_ok(monkeypatch, capsys, *common, "--method", "auto", "--speedup", "2", "--time-budget", "30m")
    summary = json.loads((out / "auto.json").read_text())
    points = [p for c in summary["candidates"] for p in c["points"]]
    assert len(points) >= 4 and {p["model"] for p in points} >= {"student"}
    assert any(p["model"].startswith("student-") and "int8" in p["model"] for p in points)
    # MoEBERT's reach on the tiny teacher, (64 + 16 + 37) / (64 + 16 + 9) = 1.31×, is below 2×
    assert [s["name"] for s in summary["skipped"]] == ["moebert"], summary["skipped"]
    assert "1.31×" in summary["skipped"][0]["reason"]
    report = (out / "report.md").read_text()
    assert report in shown and (out / "plot.png").is_file()
    assert "teacher-int8" in report and "static-embeddings" in report
    assert {b["model"] for b in summary["baselines"]} >= {"teacher", "teacher-int8", "static-embeddings"}
    chosen = summary["chosen"]
    assert chosen is not None, summary["why"]
    # the chosen model's speed-up is its own run's measurement: bench.json, teacher and model in one process
    bench = json.loads((out / "candidates" / chosen["candidate"] / "bench.json").read_text())["models"]
    measured = bench["teacher"]["latency_ms"]["median"] / bench[chosen["model"]]["latency_ms"]["median"]
    assert chosen["speedup"] == pytest.approx(measured) and measured >= 2.0
    assert chosen["point"] in summary["why"] and chosen["point"] in report and "## Chosen model" in report
    assert max(p["score"] for p in points if p["meets_target"]) == chosen["score"]
    assert "Unstable timings" in summary["why"] and "load average was above" in report
    assert {c["timings_stable"] for c in summary["candidates"] if c["points"]} == {False}

    before = _files(out / "candidates")
    run_ok(monkeypatch, capsys, *common, "--method", "auto", "--resume")
    again = json.loads((out / "auto.json").read_text())
    assert {c["status"] for c in again["candidates"]} == {"reused"}
    assert _files(out / "candidates") == before  # not one file of a finished candidate rewritten
    assert again["chosen"] == chosen
    from distillery.folders import unrecorded

    assert unrecorded(out) is None  # every file of the auto run is in its records: --overwrite may replace it
    code, _, err = run_cli(monkeypatch, capsys, *common, "--method", "auto", "--resume", "--speedup", "3")
    assert_one_line_error(code, err, "given differently")
    code, _, err = run_cli(monkeypatch, capsys, *common, "--method", "auto", "--speedup", "2")
    assert_one_line_error(code, err, "pass --resume to continue it")


def test_a_latency_target_is_planned_from_the_teacher_timed_here(tiny_bert4):
    from distillery.auto import plan_for

    settings = {"teacher.name": tiny_bert4, "bench.latency_shape": [1, 16], "bench.latency_runs": 3}
    timed = {"target": {"speedup": None, "latency_ms": 1e6}, "settings": settings}
    with pytest.raises(DistilleryError, match="already meets the target"):
        plan_for(timed)
    teacher_ms = timed["teacher_ms"]
    # beyond every candidate's FLOP-ideal reach (AutoTinyBERT's smallest sub-network: 27.5× here): refused
    with pytest.raises(DistilleryError, match="No candidate can reach"):
        plan_for({"target": {"speedup": None, "latency_ms": 1e-6}, "settings": settings, "teacher_ms": teacher_ms})
    state = {"target": {"speedup": None, "latency_ms": teacher_ms / 3}, "settings": settings, "teacher_ms": teacher_ms}
    candidates, skipped, _, _ = plan_for(state)
    assert teacher_ms > 0 and state["plan_speedup"] == pytest.approx(3)
    by_name = {c.name: c for c in candidates}
    assert by_name["autotinybert"].options["budget_ms"] == teacher_ms / 3 and "distill-1l" in by_name
    assert [s["name"] for s in skipped] == ["moebert"]


def test_what_no_candidate_can_do_is_refused_before_anything_trains(tiny_bert, glue_dir, monkeypatch, capsys, tmp_path):
    """Issue 41: an option value every candidate would fail on, and a target beyond every candidate's
    FLOP-ideal speed-up, are one sentence before the folder is touched."""
    out = tmp_path / "auto"
    common = ["compress", "--method", "auto", "--teacher", str(tiny_bert), "--data-dir", str(glue_dir), "--out", str(out)]
    for args, words in ((["--speedup", "2", "--option", "temperature=0"], "--method auto: Option temperature must be"),
                        (["--speedup", "1e9"], "No candidate can reach a 1e+09× speed-up over this teacher")):
        code, _, err = run_cli(monkeypatch, capsys, *common, *args)
        assert_one_line_error(code, err, words)
    assert not out.exists()


def test_nothing_chosen_exits_non_zero_and_the_report_lists_each_skipped_candidate_once(
        tiny_bert4, glue_dir, monkeypatch, capsys, tmp_path):
    import distillery.auto

    def none_ran(candidates, configs, out, budget_s):
        return [], [{"name": c.name, "method": c.method, "reason": "it broke"} for c in candidates]

    monkeypatch.setattr(distillery.auto, "run_candidates", none_ran)
    out = tmp_path / "auto"
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--method", "auto", "--speedup", "2", "--teacher",
                           str(tiny_bert4), "--data-dir", str(glue_dir), "--out", str(out))
    assert_one_line_error(code, err, "No candidate finished with a score and a latency, so no model can be chosen.")
    summary = json.loads((out / "auto.json").read_text())
    report = (out / "report.md").read_text()
    names = [c["name"] for c in summary["candidates"]] + [s["name"] for s in summary["skipped"]]
    for name in set(names):
        assert sum(line.startswith(f"- `{name}`") for line in report.splitlines()) == 1, name
