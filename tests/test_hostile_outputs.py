"""Issue 31, output paths: a command's ``--out`` never damages a file or folder it did not make.

A file given as ``--out`` (eval, bench, moebert importance, autotinybert latency) is refused when it
is an input of the command or lies inside one, ``--overwrite`` included, and replaced otherwise only
with ``--overwrite``; a merged report writes only into a folder it made; ``--resume`` writes only into
a folder distillery marked; a ``.distillery`` file counts as a marker only with distillery's
signature; a symbolic link is neither written nor deleted through. Each refusal is one sentence and
what was refused survives byte for byte."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from distillery.errors import DistilleryError
from distillery.folders import (EXPORT_MANIFEST, MARKER, SIGNATURE, check_file_target, check_target, claim, is_ours,
                                mark, marker_kind, write_file)
from tests.helpers import assert_one_line_error, run_cli, run_ok, write_glue


def snapshot(path) -> dict[str, bytes | None]:
    """Every file at or below ``path`` (relative path → bytes), every folder (→ None)."""
    path = Path(path)
    if path.is_file():
        return {".": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() if p.is_file() else None for p in sorted(path.rglob("*"))}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_glue(tmp_path_factory.mktemp("data"), n_train=16, n_dev=8)


@pytest.fixture(scope="module")
def model(tmp_path_factory, tiny_bert):
    """A saved tiny BERT with a 2-class head, and a run folder holding it as its student."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    root = tmp_path_factory.mktemp("models")
    run = root / "run"
    for folder in (root / "two", run / "student"):
        AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2).save_pretrained(folder)
        AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(folder)
    mark(run, "run")
    (run / "config.yaml").write_text("method: distill\n")
    return root


def refused(monkeypatch, capsys, fragment, *args):
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, fragment)


# -- --out FILE: never an input, never an existing file without --overwrite -----------------------


def test_eval_out_never_writes_into_the_model_or_the_data(monkeypatch, capsys, model, data):
    two, sst = model / "two", data / "glue" / "SST-2"
    before = snapshot(two), snapshot(data)
    for out in (two / "config.json", sst / "dev.tsv", two / "new.json", sst / "train.tsv"):
        for flags in ((), ("--overwrite",)):
            refused(monkeypatch, capsys, "input of this command",
                    "eval", str(two), "--data-dir", str(data), "--out", str(out), *flags)
    assert (snapshot(two), snapshot(data)) == before


def test_bench_out_never_writes_into_a_model_it_measures(monkeypatch, capsys, model):
    run = model / "run"
    before = snapshot(run)
    for flags in ((), ("--overwrite",)):
        refused(monkeypatch, capsys, "input of this command", "bench", str(run), "--latency-runs", "1",
                "--out", str(run / "student" / "model.safetensors"), *flags)
    assert snapshot(run) == before


def test_moebert_importance_out_never_writes_into_the_teacher(monkeypatch, capsys, tmp_path, tiny_bert, data):
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_bert, teacher)
    before = snapshot(teacher)
    refused(monkeypatch, capsys, "input of this command", "moebert", "importance", "--teacher", str(teacher),
            "--data-dir", str(data), "--out", str(teacher / "model.safetensors"), "--overwrite")
    assert snapshot(teacher) == before


def test_an_existing_file_is_replaced_only_with_overwrite(monkeypatch, capsys, tmp_path, model, data):
    out = tmp_path / "metrics.json"
    out.write_text("my results\n")
    args = ["eval", str(model / "two"), "--data-dir", str(data), "--out", str(out)]
    refused(monkeypatch, capsys, "--overwrite", *args)
    assert out.read_text() == "my results\n"
    printed = run_ok(monkeypatch, capsys, *args, "--overwrite")
    assert json.loads(out.read_text()) == json.loads(printed)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]  # no temporary file left


def test_check_file_target_and_write_file(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "a-file").write_text("")
    for out, flags, fragment in ((model / "config.json", {"overwrite": True}, "is inside an input"),
                                 (model / "sub" / "x.json", {"overwrite": True}, "is inside an input"),
                                 (model, {}, "is a folder"),
                                 (model / "config.json" / "x.json", {}, "is inside an input"),
                                 (tmp_path / "a-file" / "x.json", {}, "which is a file"),
                                 (Path(os.devnull), {"overwrite": True}, "not a regular file")):
        with pytest.raises(DistilleryError, match=fragment):
            check_file_target(out, inputs=[model, None, "a-hub/id"], **flags)
    out = check_file_target(tmp_path / "new" / "scores.bin", inputs=[model])
    write_file(out, b"\x00\x01")
    assert out.read_bytes() == b"\x00\x01"
    with pytest.raises(DistilleryError, match="--overwrite"):
        check_file_target(out)


# -- report runA runB --out FOLDER ----------------------------------------------------------------


def write_run(folder: Path, method: str) -> Path:
    """The files a report reads, for a run of ``method`` on SST-2."""
    folder.mkdir(parents=True)
    mark(folder, "run")
    (folder / "config.yaml").write_text(yaml.safe_dump({"method": method, "data": {"task": "sst2"}}))
    (folder / "metrics.json").write_text(json.dumps({"task": "sst2", "main_metric": "accuracy",
                                                     "teacher": {"accuracy": 0.9}, "student": {"accuracy": 0.8}}))
    latency = {"teacher": 10.0, "student": 5.0}
    (folder / "bench.json").write_text(json.dumps(
        {"models": {name: {"params": 1000, "latency_ms": {"median": ms}} for name, ms in latency.items()}}))
    return folder


def test_report_out_never_writes_into_a_folder_it_did_not_make(monkeypatch, capsys, tmp_path):
    runs = [str(write_run(tmp_path / name, name)) for name in ("distill", "moebert")]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("# my own report\n")
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / MARKER).write_text("editor=vim\n")
    (fake / "report.md").write_text("# mine too\n")
    other_run = write_run(tmp_path / "other", "cmow")
    before = {p: snapshot(p) for p in (mine, fake, other_run, tmp_path / "distill")}
    for out, fragment in ((mine, "not written by distillery"), (fake, "not written by distillery"),
                          (other_run, "not a report folder"), (runs[0], "input of this command"),
                          (tmp_path, "input of this command")):
        refused(monkeypatch, capsys, fragment, "report", *runs, "--out", str(out))
    assert {p: snapshot(p) for p in before} == before

    merged = tmp_path / "merged"
    for _ in range(2):  # made and marked the first time, rewritten in place the second
        run_ok(monkeypatch, capsys, "report", *runs, "--out", str(merged))
        assert marker_kind(merged) == "report" and (merged / "plot.png").is_file()
        assert sorted(p.name for p in merged.iterdir()) == [MARKER, "plot.png", "report.md"]


# -- --resume and --overwrite: only folders distillery marked --------------------------------------


def distillery_shaped(folder: Path, tiny_bert, data) -> None:
    """A folder of the user's that looks like a run: a valid config.yaml, the user's report.md."""
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(
        {"method": "distill", "teacher": {"name": str(tiny_bert)}, "data": {"data_dir": str(data)}}))
    (folder / "report.md").write_text("my notes\n")
    (folder / "metrics.json").write_text("{}")


def test_resume_never_writes_into_a_folder_distillery_did_not_mark(monkeypatch, capsys, tmp_path, tiny_bert, data):
    folder = tmp_path / "mine"
    distillery_shaped(folder, tiny_bert, data)
    before = snapshot(folder)
    refused(monkeypatch, capsys, "not written by distillery", "compress", "--out", str(folder), "--resume")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the movie was good\n" * 8)
    refused(monkeypatch, capsys, "not written by distillery", "cmow", "pretrain", "--out", str(folder),
            "--corpus", str(corpus), "--teacher", tiny_bert, "--resume")
    assert snapshot(folder) == before


@pytest.mark.parametrize("content", ["editor=vim\n", "{}", '{"kind": "run"}', "[1, 2]", "\xff\xfe garbage",
                                     '{"kind": "run", "created": "yesterday", "distillery": null}',
                                     '{"kind": "run", "created": "2026-11-24 10:00:00", "distillery": null, "x": 1}'])
def test_a_marker_without_distillerys_signature_does_not_make_a_folder_ours(monkeypatch, capsys, tmp_path, tiny_bert,
                                                                            data, content):
    folder = tmp_path / "mine"
    distillery_shaped(folder, tiny_bert, data)
    (folder / MARKER).write_text(content)
    before = snapshot(folder)
    assert not is_ours(folder)
    for flags in (("--overwrite",), ("--resume",)):
        refused(monkeypatch, capsys, "not written by distillery", "compress", "--teacher", tiny_bert,
                "--data-dir", str(data), "--out", str(folder), *flags)
    assert snapshot(folder) == before


def test_only_a_record_distillery_signed_for_this_folder_is_recognised(tmp_path):
    """A record mark() wrote counts; one written before records were signed (kind, created, distillery),
    an export's manifest, a link to another folder's record, a copy of a valid record and an edited one
    do not."""
    ours = tmp_path / "ours"
    ours.mkdir()
    mark(ours, "model")
    assert marker_kind(ours) == "model"
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / MARKER).write_text(json.dumps({"kind": "run", "created": "2026-11-24 10:00:00", "distillery": "0.1.0"}))
    assert marker_kind(legacy) is None
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(ours / MARKER, linked / MARKER)
    assert not is_ours(linked)
    copied = tmp_path / "copied"
    shutil.copytree(ours, copied)
    assert not is_ours(copied)
    edited = json.loads((ours / MARKER).read_text())
    edited["kind"] = "run"
    (ours / MARKER).write_text(json.dumps(edited))
    assert not is_ours(ours)
    export = tmp_path / "export"
    export.mkdir()
    (export / EXPORT_MANIFEST).write_text(json.dumps({"format": "onnx", "inputs": ["input_ids"], "outputs": ["logits"]}))
    assert not is_ours(export)


def test_a_forged_record_never_gets_a_users_folder_deleted(monkeypatch, capsys, tmp_path, tiny_bert, data):
    """Issue 41: a user's folder with a hand-written .distillery of the documented shape, and one holding a
    copy of a record distillery wrote for another folder, are refused by --overwrite; the user's notes
    survive byte for byte."""
    real = claim(tmp_path / "real", "run")
    for name, marker in (("forged", json.dumps({"marker": SIGNATURE, "kind": "run"})),
                         ("copied", (real / MARKER).read_text())):
        folder = tmp_path / name
        folder.mkdir()
        (folder / MARKER).write_text(marker)
        (folder / "notes.txt").write_bytes(b"my notes \x00\xff\n")
        before = snapshot(folder)
        refused(monkeypatch, capsys, "not written by distillery", "compress", "--teacher", tiny_bert,
                "--data-dir", str(data), "--out", str(folder), "--overwrite")
        assert snapshot(folder) == before


def test_overwrite_stops_at_a_file_distillery_did_not_write(monkeypatch, capsys, tmp_path, tiny_bert, data):
    """A genuine run folder with a user's file dropped in, or a file distillery wrote and the user then
    changed: --overwrite names the file and deletes nothing."""
    run = claim(tmp_path / "run", "run")
    write_file(run / "metrics.json", "{}")
    write_file(run / "student" / "config.json", "{}")
    (run / "student" / "notes.txt").write_text("mine\n")
    before = snapshot(run)
    refused(monkeypatch, capsys, "notes.txt was not written by distillery", "compress", "--teacher", tiny_bert,
            "--data-dir", str(data), "--out", str(run), "--overwrite")
    assert snapshot(run) == before
    (run / "student" / "notes.txt").unlink()
    (run / "metrics.json").write_text('{"edited": true}')
    before = snapshot(run)
    refused(monkeypatch, capsys, "metrics.json was not written by distillery (or was changed since)", "compress",
            "--teacher", tiny_bert, "--data-dir", str(data), "--out", str(run), "--overwrite")
    assert snapshot(run) == before


# -- symbolic links and names too long --------------------------------------------------------------


def test_overwrite_never_deletes_through_a_symbolic_link(monkeypatch, capsys, tmp_path, tiny_bert, data):
    run = claim(tmp_path / "run", "run")
    write_file(run / "metrics.json", "{}")
    link = tmp_path / "link"
    os.symlink(run, link)
    before = snapshot(run)
    refused(monkeypatch, capsys, "symbolic link", "compress", "--teacher", tiny_bert, "--data-dir", str(data),
            "--out", str(link), "--overwrite")
    inside = run / "self"  # a link inside the run to the run itself
    os.symlink(run, inside)
    before = snapshot(run)
    refused(monkeypatch, capsys, "symbolic link", "export", str(tiny_bert), "--format", "torch-int8",
            "--out", str(inside), "--overwrite")
    assert snapshot(run) == before and link.is_symlink() and inside.is_symlink()


def test_a_name_too_long_is_a_sentence(tmp_path):
    for check in (check_target, check_file_target):
        with pytest.raises(DistilleryError, match="too long"):
            check(tmp_path / ("x" * 300))
    long_but_valid = tmp_path / ("y" * 250)  # the temporary names beside it stay within the limit
    write_file(check_file_target(long_but_valid), "ok")
    assert long_but_valid.read_text() == "ok"
