"""`distillery autotinybert pretrain|latency|search|extract|train`: AutoTinyBERT step by step."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from distillery.autotinybert.options import AutoTinyBertOptions
# Made before the command line's modules are imported: importing them builds the command line, which adds
# this app (a step module imported first is then still half made).
app = typer.Typer(no_args_is_help=True, help="AutoTinyBERT step by step: pretrain, latency, search, extract, train (all in one: compress --method autotinybert).")

from distillery.cli.common import (DATA_HELP, Baselines, Int8, UnlabeledFile, compress_and_show,  # noqa: E402
                                   parse_options, setup_logging)
from distillery.cli.options import flag_words, with_option_flags  # noqa: E402
from distillery.config import BUILTIN_TEACHER, DEFAULT_BUDGET, DEFAULT_TASK, TrainConfig  # noqa: E402
from distillery.folders import check_file_target, check_target  # noqa: E402


@app.command("pretrain")
@with_option_flags("autotinybert", "pretrain")
def atb_pretrain(
    out: str = typer.Option(..., help="Run folder; the super-net is saved to <out>/supernet."),
    corpus: list[str] = typer.Option(..., help="Text files (plain lines or WikiExtractor output); repeatable."),
    teacher: str = typer.Option(BUILTIN_TEACHER, help="The pre-trained encoder the super-net is cut from and distilled from "
                                "(minilm, mpnet-base, a folder or a Hub id): the one task teachers are fine-tuned from."),
    max_lines: Optional[int] = typer.Option(None, help="Read at most this many lines of text."),
    max_length: int = typer.Option(128, help="Tokens per block of text."),
    steps: Optional[int] = typer.Option(None, "--steps", "--max-steps", help="Stop after this many optimizer steps."),
    epochs: float = typer.Option(1.0, help="Passes over the corpus (when --steps is not given)."),
    batch_size: int = typer.Option(32),
    lr: float = typer.Option(1e-4, help="Learning rate (warm-up 10 %, then linear decay)."),
    attention_weight: float = typer.Option(1.0, help="Weight of the attention-score MSE beside the hidden-state MSE."),
    log_every: int = typer.Option(50, help="Optimizer steps between the loss points recorded in supernet.json."),
    seed: int = typer.Option(42),
    overwrite: bool = typer.Option(False),
    resume: bool = typer.Option(False, help="Continue from the last checkpoint in --out."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
    method_options: Optional[dict] = None,
):
    """Pre-train a super-net by task-agnostic distillation on a corpus (Algorithm 1, KD setting)."""
    setup_logging(verbose)
    from distillery.autotinybert.pretrain import pretrain_supernet
    opts = AutoTinyBertOptions.read(method_options)
    train = TrainConfig(epochs=epochs, max_steps=steps, batch_size=batch_size, lr=lr, warmup_ratio=0.1,
                        select_best=False, seed=seed, eval_every=log_every, log_every=log_every)
    folder = pretrain_supernet(corpus, out, teacher=teacher, strategy=opts.strategy, train=train, samples=opts.samples,
                               attention_weight=attention_weight, max_lines=max_lines, max_length=max_length,
                               overwrite=overwrite, resume=resume)
    typer.echo(f"Super-net: {folder}\nUse it: distillery compress --method autotinybert --option supernet={folder}")


# the command's name before `pretrain`, kept for scripts that call it
app.command("supernet", hidden=True)(atb_pretrain)


@app.command("latency")
def atb_latency(
    supernet: str = typer.Option(..., help="A super-net folder (from `autotinybert pretrain`, or a run's supernet/)."),
    out: str = typer.Option("latency.json", help="Where to write the measurements and the predictor."),
    archs: int = typer.Option(150, help="Architectures to sample and time."),
    runs: int = typer.Option(15, help="Timed runs per architecture."),
    batch: int = typer.Option(1),
    seq: int = typer.Option(128),
    threads: Optional[int] = typer.Option(None, help="torch threads while timing (default: as set)."),
    seed: int = typer.Option(0),
    overwrite: bool = typer.Option(False, help="Replace an existing --out file."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
):
    """Time sampled architectures as standalone models on this machine; fit and save the predictor."""
    setup_logging(verbose)
    import random

    from distillery.autotinybert.latency import fit_predictor, measure, save_predictor
    from distillery.autotinybert.oneshot import load_supernet

    check_file_target(out, overwrite=overwrite, inputs=[supernet])  # before the minutes of timing
    net = load_supernet(supernet)
    sampled = net.space.sample_distinct(archs, random.Random(seed))
    ms = measure(net, sampled, shape=(batch, seq), runs=runs, threads=threads)
    predictor, report = fit_predictor(net.space, sampled, ms, seed=seed)
    path = save_predictor(out, predictor, report, sampled, ms, (batch, seq), threads)
    typer.echo(f"Held-out MAPE {report['mape_mlp']:.1f} % (FLOP baseline {report['mape_flops']:.1f} %) on "
               f"{report['test']} architectures; saved {path}")


@app.command("extract")
def atb_extract(
    supernet: str = typer.Option(..., help="A super-net folder (from `autotinybert pretrain`, or a run's supernet/)."),
    arch: str = typer.Option(..., help="l,d_m,d_f,h,d_qkv"),
    out: str = typer.Option(..., help="Folder for the standalone model (safetensors + tokenizer)."),
    overwrite: bool = typer.Option(False, help="Replace an existing model folder written by distillery."),
):
    """Cut one architecture out of a super-net as a standalone AutoTinyBERT model."""
    setup_logging(False)
    from distillery.autotinybert.oneshot import load_supernet
    from distillery.autotinybert.recipe import parse_arch

    from distillery.modeling import load_tokenizer, save_model

    check_target(out, overwrite=overwrite, inputs=[supernet], kind="model")
    net = load_supernet(supernet)
    model = net.extract(parse_arch(arch))
    save_model(model, load_tokenizer(supernet), Path(out))
    typer.echo(f"{parse_arch(arch)} → {out}")


def _atb_run(step: str, task: str, teacher: str, data_dir, out, budget: str, options: dict, extra: list[str],
             overwrite: bool, verbose: bool, fixed: dict | None = None, unlabeled_file: str | None = None,
             baselines: bool | None = None, int8: bool | None = None) -> None:
    """A run of ``step``'s settings: ``options`` (its flags and own parameters), the --option pairs ``extra``
    and ``fixed``, the options the step itself sets; an option given by two of them is refused. ``unlabeled_file``:
    --unlabeled-file (an embedder's texts: the search's held-out rows and the further training's); ``baselines``,
    ``int8``: --baselines / --int8 (None: the default)."""
    setup_logging(verbose)
    fixed = fixed or {}
    given = {**flag_words(options, "autotinybert", step),
             **{name: f"autotinybert {step} (which sets {name}={str(value).lower()})" for name, value in fixed.items()}}
    options = {**options, **fixed, **parse_options(extra, given)}
    from distillery.pipeline import build_run_config

    config = build_run_config(method="autotinybert", task=task, budget=budget, teacher=teacher, data_dir=data_dir, out=out,
                              overrides={"data.unlabeled_file": unlabeled_file, "baselines": baselines, "int8": int8,
                                         **{f"method_options.{k}": v for k, v in options.items() if v is not None}})
    compress_and_show(config, overwrite)


@app.command("search")
@with_option_flags("autotinybert", "search")
def atb_search(
    task: str = typer.Option(DEFAULT_TASK),
    supernet: Optional[str] = typer.Option(None, help="A super-net: a run's supernet/, or one from `autotinybert pretrain`; default: train one here."),
    teacher: str = typer.Option(BUILTIN_TEACHER),
    data_dir: Optional[str] = typer.Option(None, help=DATA_HELP),
    out: Optional[str] = typer.Option(None, help="Run folder (search.json, search.png, latency.json, architecture.json, student/)."),
    budget: str = typer.Option(DEFAULT_BUDGET),
    unlabeled_file: UnlabeledFile = None,
    option: list[str] = typer.Option([], "--option", help="Other autotinybert option key=value (repeatable)."),
    baselines: Baselines = None,
    int8: Int8 = None,
    overwrite: bool = typer.Option(False),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
    method_options: Optional[dict] = None,
):
    """Time architectures, fit the predictor, search under the budget; the chosen sub-network is extracted,
    scored and measured as is (no further training)."""
    _atb_run("search", task, teacher, data_dir, out, budget, {"supernet": supernet, **method_options}, option, overwrite,
             verbose, fixed={"further_training": False}, unlabeled_file=unlabeled_file, baselines=baselines, int8=int8)


@app.command("train")
@with_option_flags("autotinybert", "train")
def atb_train(
    supernet: str = typer.Option(..., help="The super-net to extract from (a run's supernet/)."),
    arch: str = typer.Option(..., help="l,d_m,d_f,h,d_qkv (a search's architecture.json), or fast / conventional."),
    task: str = typer.Option(DEFAULT_TASK),
    teacher: str = typer.Option(BUILTIN_TEACHER),
    data_dir: Optional[str] = typer.Option(None, help=DATA_HELP),
    out: Optional[str] = typer.Option(None),
    budget: str = typer.Option(DEFAULT_BUDGET),
    unlabeled_file: UnlabeledFile = None,
    option: list[str] = typer.Option([], "--option", help="Other autotinybert option key=value (repeatable)."),
    baselines: Baselines = None,
    int8: Int8 = None,
    overwrite: bool = typer.Option(False),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
    method_options: Optional[dict] = None,
):
    """Extract an architecture from a trained super-net and train it further on the task (CE + KD; an embedder:
    the teacher's sentence vectors)."""
    _atb_run("train", task, teacher, data_dir, out, budget, {"supernet": supernet, "arch": arch, **method_options},
             option, overwrite, verbose, unlabeled_file=unlabeled_file, baselines=baselines, int8=int8)
