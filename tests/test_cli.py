"""The CLI turns every bad input into one line on stderr and a non-zero exit, never a traceback."""

import sys

import pytest

from distillery import cli


def run_cli(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["distillery", *args])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def run_ok(monkeypatch, capsys, *args) -> str:
    """Run the CLI and require success; return stdout."""
    monkeypatch.setattr(sys, "argv", ["distillery", *args])
    try:
        cli.main()
    except SystemExit as e:
        assert e.code in (0, None), capsys.readouterr().err
    return capsys.readouterr().out


def assert_one_line_error(code, err, fragment):
    assert code not in (0, None)
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line.strip() and "distillery: error" in line]
    assert len(lines) == 1, err
    assert fragment in lines[0], err


def test_unknown_task(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "sst3")
    assert_one_line_error(code, err, "sst3")


def test_unknown_method(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--method", "prune")
    assert_one_line_error(code, err, "Unknown method")


def test_missing_teacher_path(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--teacher", str(tmp_path / "none"),
                           "--data-dir", str(tmp_path), "--out", str(tmp_path / "run"))
    assert_one_line_error(code, err, "does not exist")


def test_data_folder_without_the_task(monkeypatch, capsys, tmp_path, tiny_bert):
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--teacher", tiny_bert, "--task", "rte",
                           "--data-dir", str(tmp_path), "--out", str(tmp_path / "run"))
    assert_one_line_error(code, err, str(tmp_path))


def test_malformed_tsv_row_names_file_and_line(monkeypatch, capsys, tmp_path, tiny_bert):
    sst = tmp_path / "glue" / "SST-2"
    sst.mkdir(parents=True)
    (sst / "train.tsv").write_text("sentence\tlabel\ngood movie\t1\nno label here\n")
    (sst / "dev.tsv").write_text("sentence\tlabel\ngood movie\t1\n")
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--teacher", tiny_bert,
                           "--data-dir", str(tmp_path), "--out", str(tmp_path / "run"))
    assert_one_line_error(code, err, "train.tsv")
    assert "3" in err


def test_student_layers_larger_than_teacher(monkeypatch, capsys, tmp_path, tiny_bert):
    from tests.test_pipeline import write_glue

    write_glue(tmp_path, n_train=16, n_dev=8)
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--teacher", tiny_bert, "--student-layers", "5",
                           "--data-dir", str(tmp_path), "--out", str(tmp_path / "run"), "--teacher-epochs", "1",
                           "--max-length", "16")
    assert_one_line_error(code, err, "teacher has 2 layers")


def test_existing_run_folder(monkeypatch, capsys, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("method: distill\n")
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--out", str(tmp_path / "run"))
    assert_one_line_error(code, err, "--overwrite")


def test_bench_of_a_folder_that_is_not_a_model(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "bench", str(tmp_path))
    assert_one_line_error(code, err, "not a saved model")


def test_option_values_are_yaml_and_exponent_floats():
    """``--option`` values: YAML types, and ``3e-4`` a float (YAML 1.1 leaves it a string)."""
    assert cli.parse_options(["lambda=3e-4", "experts=4", "routing=hash-r", "shared-mode=tied", "flag=true"]) == {
        "lambda": 3e-4, "experts": 4, "routing": "hash-r", "shared_mode": "tied", "flag": True}
