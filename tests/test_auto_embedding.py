"""``compress --method auto --task embedding`` (issue 55): the methods planned are those that handle the embedding
kind (every method; static's ``unhandled_kinds`` holds every other kind), static only for a target beyond what a
transformer student reaches; candidates are scored by STS-B Spearman and chosen as for every kind."""

from __future__ import annotations

import json

import pytest
import yaml

from distillery.auto import candidate_config, plan, route_options
from distillery.config import nested_settings
from distillery.errors import DistilleryError
from tests.helpers import (TINY_RUN, flop_timed, make_tiny_bert, run_ok, size_timed, write_embedding_data,
                           write_sentence_transformer)


def _minilm_like():
    from transformers import BertConfig

    return BertConfig(num_hidden_layers=6, hidden_size=384, intermediate_size=1536, num_attention_heads=12)


def test_auto_plans_the_methods_that_handle_embeddings_and_static_only_beyond_a_transformers_reach(monkeypatch, tmp_path):
    monkeypatch.setattr("distillery.distill.auto._available", lambda name: False)  # no packaged encoder timed here
    options = route_options({}, "embedding")
    assert set(options) == {"distill", "moebert", "autotinybert", "cmow", "static", "prune"}
    assert "static" not in route_options({}, "classification")  # a head on static vectors is the baseline's
    assert route_options({"matrix_dim": 4}, "embedding")["cmow"] == {"matrix_dim": 4}  # the CMOW embedder's
    assert route_options({"mask_steps": 4}, "embedding")["prune"] == {"mask_steps": 4}  # prune makes embedders too
    with pytest.raises(DistilleryError, match="No method that auto tries has the option"):
        route_options({"no_such_option": 4}, "embedding")
    # 4× on six layers with an int8 export 2.2× as fast: one layer's int8 export reaches 13.2×, so no static table
    candidates, skipped = plan(_minilm_like(), 4.0, 128, options, int8_gain=2.2)
    assert "static" not in {c.method for c in candidates} and "cmow" in {c.method for c in candidates}
    assert "a transformer student can reach" in next(s["reason"] for s in skipped if s["name"] == "static")
    # prune, in its cheap mode, pruned to the target by its own latency model
    assert next(c for c in candidates if c.name == "prune").options == {"mode": "cheap", "speedup": 4.0}
    # 20× is beyond it: the static table is planned, without an export, beside the transformer students
    candidates, _ = plan(_minilm_like(), 20.0, 128, options, int8_gain=2.2)
    static = next(c for c in candidates if c.method == "static")
    assert not static.exports and {"distill", "autotinybert"} <= {c.method for c in candidates}
    assert "prune" not in {c.method for c in candidates}  # past the 12× it is planned for
    assert "13.20×" in static.why
    shared = {"data.task": "embedding", "teacher.name": "minilm", "export": ["onnx"]}
    assert candidate_config(static, shared, tmp_path).export == []
    distill = next(c for c in candidates if c.method == "distill")
    assert candidate_config(distill, shared, tmp_path).export == ["onnx", "int8"]


@pytest.mark.slow  # every candidate of an embedder, on a loaded 2-core machine
def test_auto_chooses_an_embedder_by_sts_spearman(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "cache"))
    flop_timed(monkeypatch)
    size_timed(monkeypatch)  # prune's latency model
    monkeypatch.setattr("distillery.auto.int8_gain", lambda *args: 1.0)  # no timing decides the plan
    teacher = write_sentence_transformer(make_tiny_bert(tmp_path / "bert", num_layers=2), tmp_path / "st")
    data_dir, texts = write_embedding_data(tmp_path / "data")
    settings = tmp_path / "tiny.yaml"
    settings.write_text(yaml.safe_dump(nested_settings({**TINY_RUN, "student.epochs": 1.0})))
    out = tmp_path / "auto"
    options = {"importance_examples": 40, "supernet_steps": 3, "latency_archs": 8, "latency_runs": 1,
               "generations": 1, "population": 2, "proxy_examples": 16, "budget_floor": 0, "pca_dims": 16,
               "latency_shapes": 8, "fisher_examples": 32}
    run_ok(monkeypatch, capsys, "compress", "--task", "embedding", "--teacher", teacher, "--data-dir", str(data_dir),
           "--unlabeled-file", texts, "--out", str(out), "--config", str(settings),
           *[a for k, v in options.items() for a in ("--option", f"{k}={v}")],
           "--method", "auto", "--speedup", "3", "--time-budget", "30m")
    summary = json.loads((out / "auto.json").read_text())
    planned = {c["method"] for c in summary["candidates"]}
    assert {"distill", "cmow", "static", "prune"} <= planned, summary["candidates"]
    static = next(c for c in summary["candidates"] if c["method"] == "static")
    assert static["points"] and all("int8" not in p["model"] for p in static["points"])
    assert "sts_spearman" in (out / "report.md").read_text()
    assert static["options"] == {"pca_dims": 16}  # its own options only: the others' are not routed to it
    # the static table meets 3× with room (11× on the tiny teacher, one run): a choice is made, by STS-B Spearman
    assert summary["chosen"] is not None and "sts_spearman" in summary["why"], summary["why"]
    meeting = [p for c in summary["candidates"] for p in c["points"] if p["meets_target"] and not p["failed"]]
    assert summary["chosen"]["point"] == "teacher-int8" or summary["chosen"]["point"] in {p["point"] for p in meeting}
