"""An export folder (ONNX, torch int8) is a teacher for a method that reads only the teacher's outputs (cmow):
given fine-tuned, it is loaded by runtime.load_export, scored on dev, labels the train split (logits cached by
its own weights), is benchmarked beside the student, and the chain names it. Every other method, and an export
not given fine-tuned, is refused with a sentence naming the folder to give instead."""

from __future__ import annotations

import json

import pytest

from distillery.errors import DistilleryError
from tests.families import compress
from tests.helpers import write_glue

FORMATS = ("onnx", "torch-int8")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache of this module's own, so that what the runs add to it can be counted."""
    folder = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DISTILLERY_CACHE", str(folder))
        yield folder


@pytest.fixture(scope="module")
def first(tiny_bert, tmp_path_factory, cache):
    """A distill run on the tiny BERT (the teacher fine-tuned and cached here), and its glue data."""
    glue = write_glue(tmp_path_factory.mktemp("glue"), n_train=32, n_dev=16)
    return compress("distill", tiny_bert, glue, tmp_path_factory.mktemp("runs") / "first",
                    **{"method_options.student_layers": 1}), glue


@pytest.fixture(scope="module")
def exports(first):
    """The distill student exported in each format, scored on SST-2 dev (RUN/exports/student-<format>)."""
    from distillery.export import export_model

    return {fmt: export_model(first[0], fmt, task="sst2") for fmt in FORMATS}


def entries(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.mark.parametrize("fmt", FORMATS)
def test_cmow_on_an_export_of_a_distill_student(fmt, first, exports, cache, tmp_path):
    run, glue = first
    export = exports[fmt]
    teachers, logits = entries(cache / "teachers"), entries(cache / "logits")
    # --export torch-int8: the student is exported too; the teacher, an export already, is not exported again
    second = compress("cmow", export, glue, tmp_path / "second", finetuned=True, export=["torch-int8"])

    metrics = json.loads((second / "metrics.json").read_text())
    manifest = json.loads((export / "distillery_export.json").read_text())
    assert manifest["source"] == str(run / "student")
    # the teacher scored on dev is the export itself (as export_model scored it on the same dev data)
    assert metrics["teacher"]["accuracy"] == pytest.approx(manifest["scores"]["export"]["accuracy"])
    chain = metrics["chain"]
    assert [link["method"] for link in chain] == [None, "distill", f"{fmt} export", "cmow"]
    assert [link["model"] for link in chain[1:]] == [str(run / "student"), str(export), str(second / "student")]
    report = (second / "report.md").read_text()
    assert f"`distill` student → `{fmt} export` student → `cmow` student." in report
    assert "given fine-tuned" in report and "reused from the cache" not in report
    assert list(metrics["others"]) == ["student-torch-int8"]
    student_export = json.loads((second / "exports" / "student-torch-int8" / "distillery_export.json").read_text())
    assert student_export["source"] == str(second / "student")  # where it came from, for a chain that goes on

    bench = json.loads((second / "bench.json").read_text())["models"]  # benchmarked in the run's process
    backend = "onnxruntime" if fmt == "onnx" else "int8"
    assert backend in bench["teacher"]["backend"] and "backend" not in bench["student"]
    assert set(bench) == {"teacher", "student", "student-torch-int8"}
    train = json.loads((second / "train.json").read_text())
    assert train["teacher_path"] == str(export) and train["teacher_seconds"] == 0.0
    # a teacher given fine-tuned is never fine-tuned nor cached; its train-split logits are, once
    assert entries(cache / "teachers") == teachers
    assert len(entries(cache / "logits")) == len(logits) + 1


def test_the_logits_cache_tells_exports_apart(first, exports):
    """The logits cache key is the teacher's weights: an ONNX graph's bytes, the int8 model's quantized
    weights, the fp32 model's tensors: three keys, each the same when loaded again."""
    from distillery.runtime import load_model, weights_digest

    folders = [first[0] / "student", exports["onnx"], exports["torch-int8"]]
    digests = [weights_digest(load_model(folder)) for folder in folders]
    assert len(set(digests)) == 3
    assert digests == [weights_digest(load_model(folder)) for folder in folders]


@pytest.mark.parametrize("method", ("distill", "moebert", "autotinybert"))
def test_a_method_that_needs_the_teachers_weights_refuses_an_export(method, first, exports, tmp_path):
    run, glue = first
    with pytest.raises(DistilleryError, match=rf"onnx export, which computes outputs only, but method {method} "
                                              rf"needs the teacher as a PyTorch model folder .*; give the folder it "
                                              rf"was exported from \({run / 'student'}\)\."):
        compress(method, exports["onnx"], glue, tmp_path / "second", finetuned=True)
    assert not (tmp_path / "second").exists()  # refused before anything was written


def test_an_export_teacher_not_given_fine_tuned_is_refused(first, exports, tmp_path):
    with pytest.raises(DistilleryError, match="torch-int8 export: it computes outputs but cannot be fine-tuned; "
                                              "give it with --teacher-finetuned"):
        compress("cmow", exports["torch-int8"], first[1], tmp_path / "second")
    assert not (tmp_path / "second").exists()


def test_the_chain_of_an_export_of_a_plain_model_starts_at_that_model(first, tmp_path):
    """An export of a model no run made (here the fine-tuned teacher): its source, then the export; an export
    whose manifest names no source folder has no chain."""
    from distillery.export import export_model
    from distillery.teacher import teacher_chain

    run, glue = first
    source = json.loads((run / "train.json").read_text())["teacher_path"]
    export = export_model(source, "torch-int8", tmp_path / "teacher-int8", task="sst2", data_dir=str(glue))
    scores = json.loads((export / "distillery_export.json").read_text())["scores"]
    assert teacher_chain(str(export)) == [
        {"model": source, "method": None, "task": "sst2", "metrics": scores["source"]},
        {"model": str(export), "method": "torch-int8 export", "task": "sst2", "metrics": scores["export"]}]
    manifest = json.loads((export / "distillery_export.json").read_text())
    (export / "distillery_export.json").write_text(json.dumps({**manifest, "source": "teacher"}))
    assert teacher_chain(str(export)) is None


def test_an_export_of_a_model_without_the_tasks_head_is_refused(tiny_bert, first, tmp_path):
    from distillery.export import export_model

    export = export_model(tiny_bert, "torch-int8", tmp_path / "encoder-int8")  # a bare encoder: no head
    with pytest.raises(DistilleryError, match="is an export of a base model, not of a model fine-tuned for sst2"):
        compress("cmow", export, first[1], tmp_path / "second", finetuned=True)
