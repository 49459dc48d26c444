"""Nothing a user owns is ever deleted: every command writes only into folders it made (marked with
``.distillery``), never replaces the current directory, an input of the same command, or a folder
it did not write; each refusal is a plain sentence and the refused folder survives byte for byte."""

import os
import shutil
from pathlib import Path

import pytest

from distillery.errors import DistilleryError
from distillery.folders import (atomic_file, atomic_folder, check_target, claim, discard_unstarted, is_ours, mark,
                                previous_version, replace_with, shared_sibling, temporary_sibling, write_file)
from tests.helpers import NO_EXTRAS, assert_one_line_error, run_cli, run_ok, write_glue

RUN_FLAGS = ["--max-length", "16", "--teacher-epochs", "1", "--epochs", "1", "--batch-size", "8",
            "--latency-runs", "2", "--train-limit", "16", "--dev-limit", "8", *NO_EXTRAS]


def snapshot(folder) -> dict[str, bytes]:
    """Every file below ``folder`` (relative path → bytes), and every folder (→ None)."""
    folder = Path(folder)
    out: dict[str, bytes] = {}
    for path in sorted(folder.rglob("*")):
        out[str(path.relative_to(folder))] = path.read_bytes() if path.is_file() else None
    return out


@pytest.fixture
def user_folder(tmp_path):
    """A folder of the user's with files and a subfolder, and its snapshot."""
    folder = tmp_path / "mine"
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "config.yaml").write_text("method: distill\n")  # looks like a run, is not one
    (folder / "sub" / "data.bin").write_bytes(os.urandom(64))
    return folder, snapshot(folder)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_glue(tmp_path_factory.mktemp("data"), n_train=16, n_dev=8)


def compress_args(teacher, data, out, *more):
    return ["compress", "--teacher", str(teacher), "--data-dir", str(data), "--out", str(out), *RUN_FLAGS, *more]


# -- compress ---------------------------------------------------------------------------------------


def test_out_dot_overwrite_keeps_the_current_directory(monkeypatch, capsys, tmp_path, user_folder, tiny_bert, data):
    folder, before = user_folder
    monkeypatch.chdir(folder)
    code, _, err = run_cli(monkeypatch, capsys, *compress_args(tiny_bert, data, ".", "--overwrite"))
    assert_one_line_error(code, err, "not written by distillery")
    assert snapshot(folder) == before


def test_out_a_distillery_run_in_the_current_directory_is_not_deleted(monkeypatch, capsys, tmp_path, tiny_bert, data):
    """Even a folder distillery wrote is not deleted when it is where the user stands."""
    run = tmp_path / "run"
    claim(run, "run")
    write_file(run / "metrics.json", "{}")
    before = snapshot(run)
    monkeypatch.chdir(run)
    code, _, err = run_cli(monkeypatch, capsys, *compress_args(tiny_bert, data, ".", "--overwrite"))
    assert_one_line_error(code, err, "current directory")
    assert snapshot(run) == before


def test_out_the_teacher_folder_overwrite_keeps_the_teacher(monkeypatch, capsys, tmp_path, tiny_bert, data):
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_bert, teacher)
    before = snapshot(teacher)
    code, _, err = run_cli(monkeypatch, capsys, *compress_args(teacher, data, teacher, "--overwrite"))
    assert_one_line_error(code, err, "input of this command")
    assert snapshot(teacher) == before


def test_out_the_data_folder_or_its_parent_keeps_the_data(monkeypatch, capsys, tmp_path, tiny_bert):
    parent = tmp_path / "work"
    data = write_glue(parent / "data", n_train=16, n_dev=8)
    mark(parent, "run")  # even a marked folder is not replaced when it holds an input
    before = snapshot(parent)
    for out in (data, parent):
        code, _, err = run_cli(monkeypatch, capsys, *compress_args(tiny_bert, data, out, "--overwrite"))
        assert_one_line_error(code, err, "input of this command")
        assert snapshot(parent) == before


def test_out_a_user_folder_overwrite_keeps_it(monkeypatch, capsys, user_folder, tiny_bert, data):
    folder, before = user_folder
    for flags in ((), ("--overwrite",)):
        code, _, err = run_cli(monkeypatch, capsys, *compress_args(tiny_bert, data, folder, *flags))
        assert_one_line_error(code, err, "not written by distillery")
        assert snapshot(folder) == before


def test_out_naming_a_file(monkeypatch, capsys, tmp_path, tiny_bert, data):
    file = tmp_path / "results.txt"
    file.write_text("keep me")
    code, _, err = run_cli(monkeypatch, capsys, *compress_args(tiny_bert, data, file, "--overwrite"))
    assert_one_line_error(code, err, "is a file")
    assert file.read_text() == "keep me"


def test_a_failed_run_leaves_nothing_that_blocks_the_rerun(monkeypatch, capsys, tmp_path, tiny_bert, data):
    """A run that fails after its folder was made (here: a data folder without the task) leaves no
    folder behind; a folder left by an older failure (config.yaml alone) does not block the rerun."""
    run = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, *compress_args(tiny_bert, tmp_path / "empty-data", run))
    assert code not in (0, None) and "Traceback" not in err
    assert not run.exists()

    claim(run, "run")
    write_file(run / "config.yaml", "method: distill\n")  # what an interrupted start leaves
    run_ok(monkeypatch, capsys, *compress_args(tiny_bert, data, run))
    assert (run / "metrics.json").is_file() and is_ours(run)


def test_overwrite_replaces_a_finished_run(monkeypatch, capsys, tmp_path, tiny_bert, data):
    run = tmp_path / "run"
    claim(run, "run")
    write_file(run / "metrics.json", "{}")
    write_file(run / "stale.txt", "from the old run")
    code, _, err = run_cli(monkeypatch, capsys, *compress_args(tiny_bert, data, run))
    assert_one_line_error(code, err, "--overwrite")
    run_ok(monkeypatch, capsys, *compress_args(tiny_bert, data, run, "--overwrite"))
    assert not (run / "stale.txt").exists() and (run / "student" / "config.json").is_file()


# -- teacher, export, method steps ----------------------------------------------------------------


def test_teacher_out_never_deletes_a_user_folder(monkeypatch, capsys, tmp_path, user_folder, tiny_bert, data):
    folder, before = user_folder
    args = ["teacher", "--teacher", tiny_bert, "--data-dir", str(data), "--max-length", "16", "--epochs", "1",
            "--train-limit", "16"]
    for flags in ((), ("--overwrite",)):
        code, _, err = run_cli(monkeypatch, capsys, *args, "--out", str(folder), *flags)
        assert_one_line_error(code, err, "not written by distillery")
        assert snapshot(folder) == before
    saved = tmp_path / "saved-teacher"
    run_ok(monkeypatch, capsys, *args, "--out", str(saved))
    assert (saved / "model.safetensors").is_file() and is_ours(saved)
    code, _, err = run_cli(monkeypatch, capsys, *args, "--out", str(saved))  # now it exists
    assert_one_line_error(code, err, "--overwrite")
    run_ok(monkeypatch, capsys, *args, "--out", str(saved), "--overwrite")


def test_export_overwrite_never_deletes_a_user_folder_or_the_model(monkeypatch, capsys, tmp_path, user_folder, tiny_bert):
    folder, before = user_folder
    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    model_before = snapshot(model)
    code, _, err = run_cli(monkeypatch, capsys, "export", str(model), "--format", "torch-int8", "--out", str(folder),
                           "--overwrite")
    assert_one_line_error(code, err, "not written by distillery")
    assert snapshot(folder) == before
    code, _, err = run_cli(monkeypatch, capsys, "export", str(model), "--format", "torch-int8", "--out", str(model),
                           "--overwrite")
    assert_one_line_error(code, err, "input of this command")
    assert snapshot(model) == model_before


def test_method_steps_never_delete_a_user_folder(monkeypatch, capsys, tmp_path, user_folder, tiny_bert, data):
    folder, before = user_folder
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the movie was good\nthe plot was bad\n" * 8)
    calls = [
        ["cmow", "pretrain", "--out", str(folder), "--corpus", str(corpus), "--teacher", tiny_bert, "--overwrite"],
        ["autotinybert", "pretrain", "--out", str(folder), "--corpus", str(corpus), "--teacher", tiny_bert, "--overwrite"],
        ["moebert", "convert", "--out", str(folder), "--teacher", tiny_bert, "--data-dir", str(data), "--overwrite"],
        ["moebert", "convert", "--out", tiny_bert, "--teacher", tiny_bert, "--data-dir", str(data), "--overwrite"],
    ]
    teacher_before = snapshot(tiny_bert)
    for args in calls:
        code, _, err = run_cli(monkeypatch, capsys, *args)
        assert code not in (0, None) and "Traceback" not in err, (args, err)
        assert "not written by distillery" in err or "input of this command" in err, (args, err)
        assert snapshot(folder) == before
        assert snapshot(tiny_bert) == teacher_before


# -- the helpers themselves -----------------------------------------------------------------------


def test_a_users_tmp_sibling_survives_a_save(tmp_path):
    """Writing ``x`` goes through a fresh temporary folder: a user's ``x.tmp`` is never touched."""
    sibling = tmp_path / "x.tmp"
    sibling.mkdir()
    (sibling / "keep.txt").write_text("keep")
    tmp = temporary_sibling(tmp_path / "x")
    (tmp / "f").write_text("new")
    replace_with(tmp, tmp_path / "x")
    assert (tmp_path / "x" / "f").read_text() == "new"
    assert (sibling / "keep.txt").read_text() == "keep"


def test_replace_with_refuses_a_folder_distillery_did_not_write(tmp_path, user_folder):
    folder, before = user_folder
    tmp = temporary_sibling(folder)
    with pytest.raises(DistilleryError, match="not written by distillery"):
        replace_with(tmp, folder)
    assert snapshot(folder) == before


def test_check_target_accepts_an_output_inside_an_input(tmp_path):
    """``--data-dir .`` with the default ``runs/...`` is common and harmless."""
    check_target(tmp_path / "runs" / "x", inputs=[tmp_path])
    (tmp_path / "data").mkdir()
    with pytest.raises(DistilleryError, match="input"):
        check_target(tmp_path, inputs=[tmp_path / "data"])


def test_discard_unstarted_keeps_anything_more(tmp_path):
    run = claim(tmp_path / "run", "run")
    write_file(run / "config.yaml", "x: 1\n")
    (run / "checkpoints").mkdir()
    discard_unstarted(run)
    assert (run / "checkpoints").is_dir() and (run / "config.yaml").is_file()
    shutil.rmtree(run / "checkpoints")
    discard_unstarted(run)
    assert not run.exists()


def test_atomic_folder_appears_whole_or_not_at_all(tmp_path):
    final = tmp_path / "out"
    with atomic_folder(final) as tmp:
        (tmp / "a").write_text("1")
        mark(tmp, "model")
    with pytest.raises(RuntimeError):
        with atomic_folder(final) as tmp:
            (tmp / "a").write_text("2")
            raise RuntimeError("killed")
    assert (final / "a").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the failed one's folder is gone


def test_atomic_folder_keeps_the_previous_version_until_the_new_one_is_in_place(tmp_path):
    final = tmp_path / "last"
    for value in ("1", "2"):
        with atomic_folder(final, existing="old", tmp=shared_sibling(final), durable=True) as tmp:
            (tmp / "a").write_text(value)
    assert (final / "a").read_text() == "2" and not previous_version(final).exists()
    with pytest.raises(OSError):
        with atomic_folder(final, existing="old", tmp=shared_sibling(final)) as tmp:
            raise OSError("disk full")
    assert (final / "a").read_text() == "2"
    assert shared_sibling(final).is_dir()  # other processes may still be writing into it


def test_atomic_file_replaces_or_leaves_the_old_content(tmp_path):
    path = tmp_path / "cache.json"
    with atomic_file(path, "w") as f:
        f.write("old")
    with pytest.raises(ValueError):
        with atomic_file(path) as f:
            f.write(b"half")
            raise ValueError("killed")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["cache.json"]
