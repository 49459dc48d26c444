"""The methods' options are specs: compress's flags, the step commands' flags, ``--option`` checks and the
docs' option tables all come from them (distillery.method, distillery.methods, distillery.cli.options)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import distillery.moebert.options as moebert_spec
from distillery.cli import app
from distillery.cli.docs import DOCS, compress_table, method_table, render, stale
from distillery.cli.options import option_flags
from distillery.errors import DistilleryError
from distillery.method import METHODS, get_method, method_options, number, option

# compress's method flags as they were written by hand before they were generated: names and meaning unchanged
COMPRESS_METHOD_FLAGS = {"--student-layers", "--student", "--kd-weight", "--temperature", "--hidden-weight", "--experts",
                         "--expert-size", "--shared", "--split", "--routing", "--shared-mode", "--distill-layers",
                         "--lambda", "--balance-weight", "--importance-examples", "--refit", "--speedup",
                         "--augment"}


def _flags(command) -> set[str]:
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts)}


def _commands():
    root = typer.main.get_command(app)
    return root.commands["compress"], root.commands["moebert"].commands


@dataclass
class _WarpedOptions(moebert_spec.MoEBertOptions):
    warp_factor: float = option(1.5, number(above=1), "how far the experts are warped", paper="ω", flag=True,
                                steps=("convert",))


@pytest.fixture
def warped(monkeypatch):
    """moebert with one more option in its spec, and nothing else changed."""
    monkeypatch.setattr(moebert_spec, "Options", _WarpedOptions)


def test_a_new_option_shows_up_in_compress_the_step_command_and_the_docs(warped, monkeypatch):
    compress, steps = _commands()
    assert "--warp-factor" in _flags(compress)
    assert "--warp-factor" in _flags(steps["convert"])
    assert "--warp-factor" not in _flags(steps["train"])  # only the steps its spec names
    help_text = next(p.help for p in compress.params if "--warp-factor" in p.opts)
    assert help_text == "moebert: how far the experts are warped; default 1.5."
    table = method_table("moebert")
    assert "| `warp_factor` | `--warp-factor`: compress, `moebert convert` | 1.5 | number > 1 | how far the experts are warped | ω |" in table
    assert "| `--warp-factor` | moebert | How far the experts are warped; default 1.5. |" in compress_table()
    assert "`warp_factor`" in render((DOCS / "moebert.md").read_text())

    # the flags reach the method's options: compress's ...
    seen = {}
    monkeypatch.setattr("distillery.cli.compress_and_show", lambda config, *a, **k: seen.setdefault("compress", config))
    result = CliRunner().invoke(app, ["compress", "--method", "moebert", "--warp-factor", "2.5", "--experts", "2"])
    assert result.exit_code == 0, result.output
    assert seen.pop("compress").method_options == {"warp_factor": 2.5, "experts": 2}

    # ... the step command's ...
    import distillery.moebert.recipe as recipe

    monkeypatch.setattr(recipe, "convert_step", lambda config, *a, **k: seen.setdefault("convert", config) and "x")
    result = CliRunner().invoke(app, ["moebert", "convert", "--out", "unused", "--warp-factor", "3"])
    assert result.exit_code == 0, result.output
    assert seen["convert"].method_options == {"warp_factor": 3.0}

    # ... and a value the spec refuses is a sentence naming the option, however it was given
    for args in (["--warp-factor", "0.5"], ["--option", "warp_factor=0.5"]):
        result = CliRunner().invoke(app, ["compress", "--method", "moebert", *args])
        assert result.exit_code == 0, result.output
        with pytest.raises(DistilleryError, match="Option warp_factor must be a number > 1, got 0.5"):
            get_method("moebert").options(seen.pop("compress"))


def test_compress_keeps_its_method_flags():
    compress, steps = _commands()
    assert {flag.info.flag_name for flag in option_flags()} == COMPRESS_METHOD_FLAGS
    assert COMPRESS_METHOD_FLAGS | {"--no-refit"} <= _flags(compress)
    assert {"--experts", "--expert-size", "--shared", "--split", "--routing", "--shared-mode", "--refit"} <= _flags(steps["convert"])
    assert {"--distill-layers", "--lambda", "--balance-weight", "--init"} <= _flags(steps["train"])


def test_every_step_a_spec_names_is_a_command_with_that_flag():
    root = typer.main.get_command(app)
    for method in METHODS:
        for info in method_options(method).specs():
            for step in info.spec.steps:
                assert info.flag_name in _flags(root.commands[method].commands[step]), (method, step, info.name)


def test_help_never_restates_a_default_by_hand():
    for method in METHODS:
        for info in method_options(method).specs():
            assert "default" not in info.spec.help, (method, info.name)


def test_docs_option_tables_are_up_to_date():
    """Run `python -m distillery.cli.docs` after changing a method's options."""
    assert stale() == []
    for method in METHODS:
        assert f"<!-- options: {method} -->" in (DOCS / f"{method}.md").read_text()
    assert "<!-- options: compress -->" in (DOCS / "cli.md").read_text()


def test_budgets_and_presets_are_dotted_yaml():
    from distillery.pipeline import build_run_config

    assert build_run_config(method="moebert").student.lr == 2e-4
    full_cmow = build_run_config(method="cmow", budget="full")
    assert (full_cmow.student.epochs, full_cmow.student.patience, full_cmow.student.eval_every) == (20.0, 5, None)
    assert build_run_config(method="autotinybert", budget="full").method_options["supernet_steps"] == 3000
    paper = build_run_config(method="moebert", task="mrpc", preset="paper")
    assert (paper.student.lr, paper.student.warmup_ratio, paper.method_options["lambda"]) == (3e-5, 0.0, 2.0)
    with pytest.raises(DistilleryError, match="has no presets"):
        build_run_config(method="cmow", preset="paper")


def test_the_quick_budget_stops_the_teacher_when_dev_stops_improving():
    """`make demo`'s teacher kept step 400 of 1,250: the quick budget stops the teacher's fine-tuning after
    QUICK_PATIENCE evaluations without a better dev score (the student, whose score climbs late, trains its
    pass); the full budget trains its stated epochs, and a setting given wins."""
    from distillery.pipeline import QUICK_PATIENCE, build_run_config

    quick = build_run_config()
    assert QUICK_PATIENCE == 2 and quick.teacher.train.patience == QUICK_PATIENCE and quick.student.patience is None
    assert (quick.teacher.train.eval_every, quick.student.eval_every) == (200, 200)
    full = build_run_config(budget="full")
    assert full.teacher.train.patience is None and full.student.patience is None
    given = build_run_config(overrides={"teacher.train.patience": 5, "student.patience": 7})
    assert (given.teacher.train.patience, given.student.patience) == (5, 7)


def test_the_pipeline_calls_typed_hooks():
    from distillery import pipeline

    assert "hasattr" not in Path(pipeline.__file__).read_text()


def test_the_command_line_loads_no_method_and_no_torch():
    """It reads every method package's light face (its options, presets and step commands), never a recipe or a
    student's modeling module."""
    code = ("import sys, typer; from distillery.cli import app; typer.main.get_command(app); "
            "from distillery.method import METHODS, method_data, method_options; "
            "[(method_options(m), method_data(m)) for m in METHODS]; "
            "light = [m + '.options' for m in ('distillery.distill', 'distillery.moebert', 'distillery.cmow', "
            "'distillery.autotinybert')] + ['distillery.moebert.steps']; "
            "assert all(m in sys.modules for m in light), light; "
            "recipes = [r.split(':')[0] for r in METHODS.values()]; "
            "heavy = [m for m in ('torch', 'transformers', *recipes) if m in sys.modules]; "
            "heavy += [m for m in sys.modules if m.startswith('distillery.') and '.modeling_' in m]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_only_a_distillery_error_becomes_a_sentence(monkeypatch, capsys):
    """Any other exception is a bug: it keeps its traceback."""
    import distillery.cli as cli

    def broken(*args, **kwargs):
        raise ValueError("a bug")

    monkeypatch.setattr(cli, "compress_and_show", broken)
    monkeypatch.setattr(sys, "argv", ["distillery", "compress"])
    with pytest.raises(ValueError, match="a bug"):
        cli.main()
    monkeypatch.setattr(sys, "argv", ["distillery", "compress", "--method", "moebert", "--preset", "fast"])
    with pytest.raises(SystemExit) as stopped:
        cli.main()
    assert stopped.value.code == 2
    assert capsys.readouterr().err == "distillery: error: Unknown moebert preset 'fast'; choose one of paper.\n"
