"""Adding a method is adding a package and a registry line: the toy method of tests/toy_method/ is registered by
one line in ``METHODS`` and shows up in option parsing, validation, presets, the command line's flags and auto's
plan, and runs through ``distillery.compress`` on a tiny teacher, with nothing else edited."""

import json

import pytest

from distillery.errors import DistilleryError
from tests.helpers import TINY_RUN, assert_one_line_error, run_cli, run_ok, tiny_config

TOY = "tests.toy_method.recipe:Toy"


@pytest.fixture
def toy(monkeypatch):
    from distillery.method import METHODS, method_data

    monkeypatch.setitem(METHODS, "toy", TOY)  # the one line
    yield "toy"
    method_data.cache_clear()  # its presets were read from the toy package


def test_a_registered_package_is_a_method_with_options_and_presets(toy, tiny_bert4, glue_dir, tmp_path):
    from distillery.cli.options import option_flags, preset_help
    from distillery.method import get_method, method_data, method_options, method_package
    from distillery.pipeline import build_run_config

    assert method_package(toy) == "tests.toy_method" and get_method(toy).name == "toy"
    assert method_options(toy).read({"keep_layers": 2}).keep_layers == 2
    assert method_data(toy)["budgets"]["quick"] == {"student.epochs": 1.0}
    assert "toy 'two'" in preset_help()
    assert "--keep-layers" in [f.info.flag_name for f in option_flags()]
    config = build_run_config(method=toy, preset="two", teacher=str(tiny_bert4), data_dir=str(glue_dir),
                              out=str(tmp_path / "run"))
    assert config.method_options["keep_layers"] == 2 and config.student.epochs == 1.0
    with pytest.raises(DistilleryError, match="Option keep_layers must be a whole number >= 1"):
        method_options(toy).read({"keep_layers": 0})
    with pytest.raises(DistilleryError, match="Unknown option.*for method toy: wings"):
        method_options(toy).read({"wings": 2})


def test_auto_plans_a_registered_method_from_its_package(toy):
    from transformers import BertConfig

    from distillery.auto import plan, route_options

    options = route_options({"keep_layers": 3}, "classification")
    assert options[toy] == {"keep_layers": 3} and "keep_layers" not in options["distill"]
    candidates, _ = plan(BertConfig(num_hidden_layers=4, hidden_size=32, intermediate_size=64,
                                    num_attention_heads=2), 2.0, 16, options)
    mine = next(c for c in candidates if c.method == toy)
    assert mine.options == {"keep_layers": 1} and mine.why == "the teacher's first layer"


def test_a_registered_method_runs_through_compress(toy, tiny_bert4, glue_dir, tmp_path, monkeypatch, capsys):
    import distillery

    out = distillery.compress(tiny_config(tiny_bert4, glue_dir, tmp_path / "run", method=toy,
                                          **{"method_options.keep_layers": 1}))
    student = distillery.load_student(out)
    assert student.config.num_hidden_layers == 1
    train = json.dumps(json.loads((out / "train.json").read_text()))
    assert "Toy student: the teacher's first 1 layer(s), untrained." in train
    assert "student" in json.loads((out / "metrics.json").read_text())
    # its flag on the command line, and its check before any training: a sentence, no run folder
    import yaml

    from distillery.config import nested_settings

    settings = tmp_path / "tiny.yaml"
    settings.write_text(yaml.safe_dump(nested_settings(TINY_RUN)))
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--method", "toy", "--keep-layers", "4", "--teacher",
                           str(tiny_bert4), "--data-dir", str(glue_dir), "--out", str(tmp_path / "refused"),
                           "--config", str(settings))
    assert_one_line_error(code, err, "keep_layers must be below the teacher's 4 layers")
    assert not (tmp_path / "refused").exists()
    run_ok(monkeypatch, capsys, "compress", "--method", "toy", "--keep-layers", "2", "--teacher", str(tiny_bert4),
           "--data-dir", str(glue_dir), "--out", str(tmp_path / "cli"), "--config", str(settings))
    assert distillery.load_student(tmp_path / "cli").config.num_hidden_layers == 2
