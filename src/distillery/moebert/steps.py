"""`distillery moebert importance|convert|train`: MoEBERT step by step."""

from __future__ import annotations

from typing import Optional

import typer

# Made before the command line's modules are imported: importing them builds the command line, which adds
# this app (a step module imported first is then still half made).
app = typer.Typer(no_args_is_help=True, help="MoEBERT step by step: importance, convert, train.")

from distillery.cli.common import (DATA_HELP, Baselines, Int8, UnlabeledFile, compress_and_show,  # noqa: E402
                                   given_on_command_line, setup_logging)
from distillery.cli.options import preset_help, with_option_flags  # noqa: E402
from distillery.config import BUILTIN_TEACHER, DEFAULT_BUDGET, DEFAULT_TASK  # noqa: E402
from distillery.method import get_method  # noqa: E402


def _moebert_config(task, teacher, data_dir, budget, squad_holdout, unlabeled_file, method_options, seed=None):
    from distillery.pipeline import build_run_config

    return build_run_config(method="moebert", task=task, budget=budget, teacher=teacher, data_dir=data_dir, overrides={
        "data.squad_holdout": squad_holdout, "student.seed": seed, "data.seed": seed,
        "data.unlabeled_file": unlabeled_file,
        **{f"method_options.{k}": v for k, v in method_options.items()}})


@app.command("importance")
@with_option_flags("moebert", "importance")
def moebert_importance(
    task: str = typer.Option(DEFAULT_TASK),
    teacher: str = typer.Option(BUILTIN_TEACHER, help="minilm (built in), a local model folder or a Hub id."),
    data_dir: Optional[str] = typer.Option(None, help=DATA_HELP),
    budget: str = typer.Option(DEFAULT_BUDGET, help="Budget of the teacher fine-tuning (cached)."),
    squad_holdout: Optional[float] = typer.Option(None),
    unlabeled_file: UnlabeledFile = None,
    out: str = typer.Option("importance.safetensors", help="Where to write the scores."),
    overwrite: bool = typer.Option(False, help="Replace an existing --out file."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
    method_options: Optional[dict] = None,
):
    """Importance of every FFN neuron (Eq. 4) of the fine-tuned teacher, on the task's train split (--task embedding:
    on the --unlabeled-file texts, as compress reads them)."""
    setup_logging(verbose)
    from distillery.moebert.recipe import importance_step

    config = _moebert_config(task, teacher, data_dir, budget, squad_holdout, unlabeled_file, method_options)
    path = importance_step(config, out, overwrite)
    typer.echo(f"Importance scores: {path}")


@app.command("convert")
@with_option_flags("moebert", "convert")
def moebert_convert(
    out: str = typer.Option(..., help="Folder for the converted (untrained) MoEBERT model."),
    importance: Optional[str] = typer.Option(None, help="Scores from `distillery moebert importance` (default: computed now)."),
    task: str = typer.Option(DEFAULT_TASK),
    teacher: str = typer.Option(BUILTIN_TEACHER, help="minilm (built in), a local model folder or a Hub id."),
    data_dir: Optional[str] = typer.Option(None, help=DATA_HELP),
    budget: str = typer.Option(DEFAULT_BUDGET, help="Budget of the teacher fine-tuning (cached)."),
    squad_holdout: Optional[float] = typer.Option(None),
    unlabeled_file: UnlabeledFile = None,
    seed: Optional[int] = typer.Option(None, help="Seed of the random split and the hash tables."),
    overwrite: bool = typer.Option(False),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
    method_options: Optional[dict] = None,
):
    """Cut the fine-tuned teacher's FFNs into experts and save the MoEBERT model (before training)."""
    setup_logging(verbose)
    from distillery.moebert.recipe import convert_step

    config = _moebert_config(task, teacher, data_dir, budget, squad_holdout, unlabeled_file, method_options, seed)
    path = convert_step(config, importance, out, overwrite=overwrite)
    typer.echo(f"Converted MoEBERT model: {path}")


@app.command("train")
@with_option_flags("moebert", "train")
def moebert_train(
    context: typer.Context,
    init: str = typer.Option(..., help="A converted model folder (`distillery moebert convert`)."),
    task: str = typer.Option(DEFAULT_TASK),
    teacher: str = typer.Option(BUILTIN_TEACHER, help="The dense teacher the model was converted from."),
    data_dir: Optional[str] = typer.Option(None, help=DATA_HELP),
    budget: str = typer.Option(DEFAULT_BUDGET),
    out: Optional[str] = typer.Option(None, help="Run folder (default runs/<task>-moebert-<time>)."),
    preset: Optional[str] = typer.Option(None, help=preset_help()),
    epochs: Optional[float] = typer.Option(None),
    lr: Optional[float] = typer.Option(None),
    batch_size: Optional[int] = typer.Option(None),
    squad_holdout: Optional[float] = typer.Option(None),
    unlabeled_file: UnlabeledFile = None,
    baselines: Baselines = None,
    int8: Int8 = None,
    overwrite: bool = typer.Option(False),
    resume: bool = typer.Option(False),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
    method_options: Optional[dict] = None,
):
    """Layer-wise distillation of a converted model; writes a run folder like `compress`."""
    setup_logging(verbose)
    from distillery.pipeline import build_run_config

    options = {"init": init, **method_options}
    overrides = {"student.epochs": epochs, "student.lr": lr, "student.batch_size": batch_size,
                 "data.squad_holdout": squad_holdout, "data.unlabeled_file": unlabeled_file, "baselines": baselines,
                 "int8": int8, **{f"method_options.{k}": v for k, v in options.items()}}
    config = build_run_config(method="moebert", task=task, budget=budget, teacher=teacher, data_dir=data_dir, out=out,
                              preset=preset, overrides=overrides)
    # what --resume must not change, as compress's: the settings given (task, teacher, budget: unless defaulted)
    named = {"task": ("data.task", task), "teacher": ("teacher.name", teacher), "budget": ("budget", budget),
             "data_dir": ("data.data_dir", data_dir)}
    given = {**{k: v for k, v in overrides.items() if v is not None},
             **{key: value for param, (key, value) in named.items() if param in given_on_command_line(context)}}
    if preset:  # a preset's settings count as given
        given.update(get_method("moebert").preset(preset, config.data.task))
    compress_and_show(config, overwrite, resume, given)
