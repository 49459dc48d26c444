"""The CLI turns every bad input into one line on stderr and a non-zero exit, never a traceback."""

from distillery import cli
from tests.helpers import assert_one_line_error, run_cli, write_glue


def test_unknown_task(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "sst3")
    assert_one_line_error(code, err, "sst3")


def test_unknown_method(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--method", "no-such-method")
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


def test_an_option_given_twice_is_refused_naming_both():
    """Issue 52: the last --option, or a flag over --option, used to win without a word."""
    import pytest

    from distillery.errors import DistilleryError

    with pytest.raises(DistilleryError, match=r"^lambda is given twice: --option lambda=1 and --option lambda=2; give"):
        cli.parse_options(["lambda=1", "lambda=2"])
    with pytest.raises(DistilleryError, match=r"^kd_weight is given twice: --kd-weight 0.1 and --option kd-weight=0.9"):
        cli.parse_options(["kd-weight=0.9"], {"kd_weight": "--kd-weight 0.1"})
