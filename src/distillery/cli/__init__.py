"""`distillery <command>`: parse options, build a config, call the stage. Nothing else lives here."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Optional

import click
import typer

from distillery.auto import compress_auto
from distillery.card import write_card
from distillery.cli.common import (DATA_HELP, Baselines, DevFile, Int8, LabelAllSubwords, LabelColumn, Pooling, Regression, TagColumn,
                                   TextColumn, TextPairColumn, TokenColumn, TrainFile, UnlabeledFile, app,
                                   compress_and_show, custom_data, parse_options, setup_logging)
from distillery.cli.options import flag_words, preset_help, with_option_flags
from distillery.config import (BUILTIN_TEACHER, DEFAULT_BUDGET, DEFAULT_TASK, dotted_settings, read_yaml_mapping,
                               resolve_data_dir, run_inputs)
from distillery.errors import DistilleryError
from distillery.folders import check_file_target, check_target, write_file
from distillery.method import METHODS, get_method, method_module
from distillery.report import merge_runs, write_report

__all__ = ["app", "main", "parse_options", "setup_logging"]

# The speed settings of `bench` and `compress`: one measurement per CPU thread count and per CUDA precision.
THREADS_HELP = "Benchmark: torch CPU threads, one count or a comma list (1,4): one measurement each (default: torch's)."
BENCH_DEVICE_HELP = ("Benchmark: cpu, cuda, or both (cpu,cuda); the first is the report's main table "
                     "(default: cpu, then cuda where torch sees a GPU).")
DTYPE_HELP = "Benchmark: CUDA precision fp32 (default), fp16 or bf16, or a comma list; the CPU is timed in fp32."


def add_step_commands() -> None:
    """`distillery <method> <step>`: the step commands of every method whose package has them (its ``steps.app``)."""
    for method in METHODS:
        steps = method_module(method, "steps")
        if steps is not None:
            app.add_typer(steps.app, name=method)


add_step_commands()
import distillery.cli.hub  # noqa: E402,F401 (registers `distillery push`)


@app.command()
@with_option_flags()
def compress(
    # None means "not given" (so that --resume can tell what was): the defaults are distill, sst2, minilm, quick
    method: Optional[str] = typer.Option(None, help=f"Compression method: {', '.join(METHODS)} (default distill, the layer-drop baseline), or auto: the most accurate of them (and their int8 exports) that meets --speedup or --latency-ms as measured here, within --time-budget."),
    task: Optional[str] = typer.Option(None, help="cola sst2 (default) mrpc stsb qqp mnli qnli rte wnli squad squad_v2 conll2003 custom"),
    teacher: Optional[str] = typer.Option(None, help="minilm (built in, default), a local model folder or a Hub id."),
    teacher_finetuned: bool = typer.Option(False, help="The teacher already has this task's head: skip fine-tuning."),
    data_dir: Optional[str] = typer.Option(None, help=DATA_HELP),
    out: Optional[str] = typer.Option(None, help="Run folder (default runs/<task>-<method>-<time>)."),
    budget: Optional[str] = typer.Option(None, help="quick (minutes on a CPU, default) or full (paper-like)."),
    overwrite: bool = typer.Option(False, help="Replace an existing run folder (only one distillery wrote)."),
    resume: bool = typer.Option(False, help="Continue the run in --out from its last checkpoint."),
    preset: Optional[str] = typer.Option(None, help=preset_help()),
    option: list[str] = typer.Option([], "--option", help="Method option key=value (repeatable)."),
    epochs: Optional[float] = typer.Option(None, help="Student epochs, on the budget's examples or the whole train split (default from the budget: quick makes one pass over a whole split larger than its 20k)."),
    lr: Optional[float] = typer.Option(None, help="Student learning rate."),
    batch_size: Optional[int] = typer.Option(None, help="Student batch size."),
    teacher_epochs: Optional[float] = typer.Option(None, help="Teacher fine-tuning epochs."),
    max_length: Optional[int] = typer.Option(None, help="Maximum tokens per example."),
    train_limit: Optional[int] = typer.Option(None, help="Use at most this many training examples."),
    dev_limit: Optional[int] = typer.Option(None, help="Score on the first N dev examples only (smoke runs)."),
    squad_holdout: Optional[float] = typer.Option(None, help="SQuAD without a train file: hold out this fraction of dev articles for evaluation, train on the rest."),
    train_file: TrainFile = None,
    dev_file: DevFile = None,
    text_column: TextColumn = None,
    text_pair_column: TextPairColumn = None,
    label_column: LabelColumn = None,
    regression: Regression = False,
    token_column: TokenColumn = None,
    tag_column: TagColumn = None,
    label_all_subwords: LabelAllSubwords = False,
    unlabeled_file: UnlabeledFile = None,
    pooling: Pooling = None,
    augment_model: Optional[str] = typer.Option(None, help="A masked LM (Hub id or folder) whose predictions augment the train split (option augment); default the teacher's own MLM head, else neighbours in its input embeddings."),
    seed: Optional[int] = typer.Option(None, help="Random seed."),
    latency_runs: Optional[int] = typer.Option(None, help="Benchmark: timed runs at 1x128."),
    threads: Optional[str] = typer.Option(None, help=THREADS_HELP),
    bench_device: Optional[str] = typer.Option(None, "--bench-device", help=BENCH_DEVICE_HELP),
    dtype: Optional[str] = typer.Option(None, help=DTYPE_HELP),
    export: list[str] = typer.Option([], "--export", help="Also export, score and measure teacher and student as onnx, onnx-int8, torch-int8 or int8 (repeatable)."),
    baselines: Baselines = None,
    int8: Int8 = None,
    config_file: Optional[str] = typer.Option(None, "--config", help="A YAML file of settings in config.yaml's shape (method, data: {task: ...}, student: {lr: ...}, method_options: {...}); flags override it."),
    push_to_hub: Optional[str] = typer.Option(None, help="Upload the student (with its model card) to this Hugging Face Hub repository (user/name) at the end."),
    latency_ms: Optional[float] = typer.Option(None, help="--method auto or prune: the target, a latency at most this many ms at 1x128 on this machine (instead of --speedup)."),
    time_budget: Optional[str] = typer.Option(None, help="--method auto: overall training time (30m, 2h, 1h30m, 90s or seconds); candidates not started when it is spent are skipped."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
    method_options: Optional[dict] = None,  # the methods' option flags (distillery.cli.options), the given ones
):
    """Fine-tune (or reuse) the teacher, build and train the student, evaluate, benchmark, report."""
    setup_logging(verbose)
    from distillery.bench import bench_flags

    flags = {
        "teacher.finetuned": teacher_finetuned or None,
        "student.epochs": epochs, "student.lr": lr, "student.batch_size": batch_size,
        "student.seed": seed, "teacher.train.seed": seed, "data.seed": seed,
        "teacher.train.epochs": teacher_epochs,
        "data.max_length": max_length, "data.train_limit": train_limit, "data.dev_limit": dev_limit,
        "data.squad_holdout": squad_holdout,
        "data.unlabeled_file": unlabeled_file, "data.augment_model": augment_model, "data.pooling": pooling,
        "data.label_all_subwords": label_all_subwords or None,
        **{f"data.{k}": v for k, v in custom_data(train_file, dev_file, text_column, text_pair_column, label_column,
                                                  regression, token_column, tag_column).items()},
        "bench.latency_runs": latency_runs,
        **{f"bench.{k}": v for k, v in bench_flags(bench_device, dtype, threads).items()},
        "export": list(export) or None,
        "baselines": baselines,
        "int8": int8,
        # an option given by its own flag and as --option key=value (or by two --option) is refused
        **{f"method_options.{k}": v
           for k, v in {**parse_options(option, flag_words(method_options or {})), **(method_options or {})}.items()},
    }
    named = {"method": method, "data.task": task, "budget": budget, "teacher.name": teacher, "data.data_dir": data_dir,
             "out": out}
    if _wants_auto(method, config_file):
        return _compress_auto(named, flags, preset, config_file, latency_ms, time_budget, overwrite, resume, push_to_hub)
    _one_method_target(method, flags, latency_ms, time_budget)
    config, given = _compress_config(named, flags, preset, config_file)
    compress_and_show(config, overwrite, resume, given, push_to_hub=push_to_hub)


def _one_method_target(method: str | None, flags: dict, latency_ms: float | None, time_budget: str | None) -> None:
    """--latency-ms of method prune: its own option (a latency on this machine, into ``flags``); refused for another
    method, as --time-budget is (auto's)."""
    if latency_ms is not None and method == "prune":
        if flags.get("method_options.speedup") is not None:
            raise DistilleryError("Give --speedup or --latency-ms, not both.")
        flags["method_options.latency_ms"], latency_ms = latency_ms, None
    if latency_ms is not None or time_budget is not None:
        raise DistilleryError("--latency-ms belongs to --method auto and prune, --time-budget to auto; add one, or "
                              "drop them.")


def _wants_auto(method: str | None, config_file: str | None) -> bool:
    if method is not None or config_file is None:
        return method == "auto"
    return read_yaml_mapping(config_file).get("method") == "auto"


def _compress_auto(named: dict, flags: dict, preset: str | None, config_file: str | None, latency_ms: float | None,
                   time_budget: str | None, overwrite: bool, resume: bool, push_to_hub: str | None) -> None:
    """``compress --method auto``: the candidates' shared settings (flags over the --config file) to
    distillery.auto; --speedup, autotinybert's flag, is auto's target."""
    if preset:
        raise DistilleryError("--preset names one method's settings, and --method auto runs several; give their "
                              "options with --option key=value instead.")
    if push_to_hub:
        raise DistilleryError("--push-to-hub uploads one run's student; after --method auto, push the chosen "
                              "candidate's run folder (auto.json names it) with `distillery push RUN REPO`.")
    file = dotted_settings(read_yaml_mapping(config_file)) if config_file else {}
    settings = {**file, **{k: v for k, v in {**flags, **named}.items() if v is not None}}
    speedup = settings.pop("method_options.speedup", None)
    report = compress_auto(settings, speedup=speedup, latency_ms=latency_ms, time_budget=time_budget,
                           overwrite=overwrite, resume=resume)
    typer.echo(report.read_text())
    typer.echo(f"Auto folder: {report.parent}")


def _compress_config(named: dict, flags: dict, preset: str | None, config_file: str | None):
    """The run's config from ``compress``'s flags over its settings file (torchtune-style), and the
    settings given explicitly (dotted keys: a --resume must not change them)."""
    from distillery.pipeline import resolve_settings

    file = dotted_settings(read_yaml_mapping(config_file)) if config_file else {}
    overrides = {**file, **{k: v for k, v in flags.items() if v is not None}}
    try:
        config = resolve_settings(file, named, flags, preset=preset)
    except DistilleryError as e:
        raise DistilleryError(f"{e} (settings from the command line and {config_file})" if config_file else str(e)) from None
    given = {**overrides, **{k: v for k, v in named.items() if k != "out" and v is not None}}
    if preset:  # a preset's settings count as given
        given.update(get_method(config.method).preset(preset, config.data.task))
    return config, given


@app.command("teacher")
def teacher_cmd(
    task: str = typer.Option(DEFAULT_TASK),
    teacher: str = typer.Option(BUILTIN_TEACHER, help="minilm (built in), a local model folder or a Hub id."),
    data_dir: Optional[str] = typer.Option(None, help=DATA_HELP),
    budget: str = typer.Option(DEFAULT_BUDGET),
    out: Optional[str] = typer.Option(None, help="Also save the fine-tuned teacher here."),
    overwrite: bool = typer.Option(False, help="Replace an existing --out folder written by distillery."),
    epochs: Optional[float] = typer.Option(None),
    lr: Optional[float] = typer.Option(None),
    max_length: Optional[int] = typer.Option(None),
    train_limit: Optional[int] = typer.Option(None),
    squad_holdout: Optional[float] = typer.Option(None),
    train_file: TrainFile = None,
    dev_file: DevFile = None,
    text_column: TextColumn = None,
    text_pair_column: TextPairColumn = None,
    label_column: LabelColumn = None,
    regression: Regression = False,
    token_column: TokenColumn = None,
    tag_column: TagColumn = None,
    verbose: bool = typer.Option(False, "--verbose", "-v"),
):
    """Fine-tune the teacher on a task (cached), score it on dev, optionally save a copy."""
    setup_logging(verbose)
    from distillery.data.loading import task_for
    from distillery.modeling import FINETUNING_TASK, save_model
    from distillery.pipeline import build_run_config
    from distillery.teacher import get_finetuned_teacher

    config = build_run_config(task=task, budget=budget, teacher=teacher, data_dir=data_dir, overrides={
        "teacher.train.epochs": epochs, "teacher.train.lr": lr, "data.max_length": max_length,
        "data.train_limit": train_limit, "data.squad_holdout": squad_holdout,
        **{f"data.{k}": v for k, v in custom_data(train_file, dev_file, text_column, text_pair_column, label_column,
                                                  regression, token_column, tag_column).items()}})
    if out:  # checked before the fine-tuning, not after it
        check_target(out, overwrite=overwrite, inputs=run_inputs(config), kind="model")
    spec = task_for(config.data)
    model, tokenizer, info = get_finetuned_teacher(config.teacher, spec, config.data)
    if out:
        setattr(model.config, FINETUNING_TASK, spec.name)  # a teacher cached before the key was written lacks it
        save_model(model, tokenizer, Path(out), kind="teacher")
        info["saved_to"] = out
    typer.echo(json.dumps(info, indent=2))


@app.command("eval")
def eval_cmd(
    model: str = typer.Argument(..., help="A saved model folder or a run folder."),
    task: Optional[str] = typer.Option(None, help=f"The task to score on (default: the one the model was trained for, as its config.json or run records it, else {DEFAULT_TASK})."),
    other_task: bool = typer.Option(False, "--other-task", help="Score a model on a --task other than the one it was trained for, with as many outputs (refused otherwise: its scores would mean nothing)."),
    data_dir: Optional[str] = typer.Option(None, help=DATA_HELP),
    split: str = typer.Option("dev", help="The dev split to score: dev, or one of the task's (MNLI: dev_matched, dev_mismatched)."),
    max_length: int = typer.Option(128),
    squad_holdout: Optional[float] = typer.Option(None),
    dev_file: DevFile = None,
    text_column: TextColumn = None,
    text_pair_column: TextPairColumn = None,
    label_column: LabelColumn = None,
    regression: Regression = False,
    token_column: TokenColumn = None,
    tag_column: TagColumn = None,
    out: Optional[str] = typer.Option(None, help="Write the metrics JSON here too (a file, not inside the model or the data)."),
    overwrite: bool = typer.Option(False, help="Replace an existing --out file."),
):
    """Score a saved model on a task's dev split (task custom: your --dev-file); prints metrics JSON."""
    setup_logging()
    from distillery.evaluation import evaluate

    if out:
        check_file_target(out, overwrite=overwrite, inputs=[model, resolve_data_dir(data_dir), dev_file])
    metrics = evaluate(model, task, data_dir=data_dir, split=split, max_length=max_length, squad_holdout=squad_holdout,
                       other_task=other_task, **custom_data(None, dev_file, text_column, text_pair_column, label_column,
                                                            regression, token_column, tag_column))
    text = json.dumps(metrics, indent=2)
    if out:
        write_file(out, text)
    typer.echo(text)


@app.command()
def bench(
    models: list[str] = typer.Argument(..., help="Model folders (run folders use their student/); the first is the reference."),
    threads: Optional[str] = typer.Option(None, help=THREADS_HELP),
    bench_device: Optional[str] = typer.Option(None, "--bench-device", help=BENCH_DEVICE_HELP),
    dtype: Optional[str] = typer.Option(None, help=DTYPE_HELP),
    latency_runs: int = typer.Option(30),
    throughput_runs: int = typer.Option(3),
    out: Optional[str] = typer.Option(None, help="Write bench JSON here too (a file, not inside a model folder)."),
    overwrite: bool = typer.Option(False, help="Replace an existing --out file."),
    export: list[str] = typer.Option([], "--export", help="Also measure each model exported as onnx, onnx-int8, torch-int8 or int8 (repeatable)."),
):
    """Latency (1x128) and throughput (256x64) of several models, interleaved in one process, per device setting."""
    setup_logging()
    from distillery.bench import bench_flags, benchmark, check_settings, format_sweep
    from distillery.modeling import load_tokenizer, model_folder
    from distillery.runtime import load_model

    settings = {**bench_flags(bench_device, dtype, threads), "latency_runs": latency_runs,
                "throughput_runs": throughput_runs}
    check_settings(settings)  # a GPU asked for on a machine without one is refused before any model loads
    if out:
        check_file_target(out, overwrite=overwrite, inputs=models)
    loaded = {}
    for i, path in enumerate(models):
        name = "teacher" if i == 0 else ("student" if len(models) == 2 else Path(path).name or f"model{i}")
        loaded[name] = load_model(path)
    if export:
        from distillery.export import build_variants

        sources = {name: (m, load_tokenizer(str(model_folder(p)))) for (name, m), p in zip(loaded.items(), models)}
        loaded.update(build_variants(sources, export)[0])
    result = benchmark(loaded, **settings)
    text = json.dumps(result, indent=2)
    if out:
        write_file(out, text)
    typer.echo(format_sweep(result))
    typer.echo(text)


@app.command("export")
def export_cmd(
    model: str = typer.Argument(..., help="A saved model folder, or a run folder (its student/)."),
    format: str = typer.Option("int8", "--format", help="onnx, onnx-int8, torch-int8, or int8 (the faster int8 backend)."),
    out: Optional[str] = typer.Option(None, help="Export folder (default: RUN/exports/student-<format>, or MODEL-<format>)."),
    task: Optional[str] = typer.Option(None, help="Check parity on this task's dev inputs and score the export on dev."),
    data_dir: Optional[str] = typer.Option(None, help=DATA_HELP),
    max_length: Optional[int] = typer.Option(None, help="Maximum tokens per example (default: the run's, else 128)."),
    dev_limit: Optional[int] = typer.Option(None, help="Score on the first N dev examples only."),
    squad_holdout: Optional[float] = typer.Option(None),
    recover: bool = typer.Option(False, help="int8: when it loses more than --recover-threshold points, a short quantization-aware distillation pass."),
    recover_threshold: float = typer.Option(1.0, help="Points of the main metric int8 may lose before --recover trains."),
    recover_steps: int = typer.Option(300, help="Optimizer steps of the recovery pass."),
    recover_teacher: Optional[str] = typer.Option(None, help="fp32 teacher of the recovery pass (default: the run's teacher, else the model itself)."),
    overwrite: bool = typer.Option(False, help="Replace an existing export folder."),
    other_task: bool = typer.Option(False, "--other-task", help="Check and score on a --task other than the one the model was trained for, with as many outputs (refused otherwise: its scores would mean nothing)."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
):
    """Export a model to ONNX (parity-checked against torch) or int8; the folder loads with load_student."""
    setup_logging(verbose)
    from distillery.export import export_model, read_manifest

    if data_dir and not task:
        raise DistilleryError("--data-dir is for the --task data; give --task too.")
    folder = export_model(model, format, out, task=task, data_dir=data_dir, overwrite=overwrite, recover=recover,
                          recover_threshold=recover_threshold, recover_steps=recover_steps,
                          recover_teacher=recover_teacher, max_length=max_length, dev_limit=dev_limit,
                          squad_holdout=squad_holdout, other_task=other_task)
    manifest = read_manifest(folder)
    summary = {k: manifest[k] for k in ("format", "backend", "exporter", "parity", "scores", "recovery") if k in manifest}
    typer.echo(json.dumps(summary, indent=2))
    typer.echo(f"Export folder: {folder}")


@app.command("transfer-set")
def transfer_set_cmd(
    corpus: list[str] = typer.Option(..., help="Text files (plain lines, one paragraph a line, or WikiExtractor output); repeatable."),
    out: str = typer.Option(..., help="The JSONL file to write (text, text_pair): give it to compress --unlabeled-file."),
    rows: int = typer.Option(30000, help="Rows to write."),
    single: bool = typer.Option(False, "--single", help="One text a row, for a single-sentence task (default: sentence pairs)."),
    max_lines: Optional[int] = typer.Option(200000, help="Read at most this many lines of text."),
    seed: int = typer.Option(0),
    overwrite: bool = typer.Option(False, help="Replace an existing --out file."),
):
    """A transfer set from a text corpus: sentences or sentence pairs without labels, for --unlabeled-file (the
    teacher labels them). A small pair task gains most (docs/cli.md, "More text")."""
    setup_logging()
    from distillery.data.transfer import write_transfer_set

    target = check_file_target(out, overwrite=overwrite, inputs=corpus)
    paragraphs = write_transfer_set(corpus, target, rows, pairs=not single, seed=seed, max_lines=max_lines)
    typer.echo(f"{rows} {'texts' if single else 'sentence pairs'} from {paragraphs} paragraphs: {target}\n"
               f"Use it: distillery compress ... --unlabeled-file {target}")


@app.command()
def report(
    runs: list[str] = typer.Argument(..., help="One run folder, or several runs of one task to compare."),
    out: Optional[str] = typer.Option(None, help="Several runs: folder for the merged report (default runs/comparison-<task>); "
                                       "created, or one an earlier merge made (never a run folder or a folder of yours)."),
):
    """Rewrite a run's report.md and plot.png; with several runs, one merged table and Pareto plot."""
    setup_logging()
    if len(runs) == 1:
        path = write_report(Path(runs[0]))
        write_card(runs[0])  # student/README.md, the model card, rebuilt too
    else:
        if out is None:
            import re

            from distillery.run_record import load_run

            # one plain folder name, whatever the run's metrics.json calls its task
            task = re.sub(r"[^\w-]+", "_", str(load_run(runs[0]).metrics.task or "task"))
            out = f"runs/comparison-{task}"
        path = merge_runs([Path(r) for r in runs], Path(out))
    typer.echo(path.read_text() if path.suffix == ".md" else f"Wrote {path}")


COMMAND_LINE_ERRORS = tuple({click.ClickException, getattr(typer, "TyperException", click.ClickException)})
ABORTS = tuple({click.exceptions.Abort, typer.Abort})
INTERRUPTED = "distillery: interrupted."
TERMINATED = "distillery: terminated (SIGTERM)."
RESUME_HINT = " Rerun with --resume to continue from the last checkpoint."
# A command without --resume starts over when run again, but a teacher's fine-tuning (teacher.py) always continues
# from the checkpoints of its cache entry: `distillery teacher` and the steps that fine-tune one.
RERUN_HINT = " Run the command again (a teacher's fine-tuning continues from its last checkpoint)."
_terminated = False


def takes_resume(args: list[str]) -> bool:
    """Whether the command of the command line ``args`` (``compress``, ``autotinybert pretrain``) has --resume:
    only then does the stop message point to it."""
    command = typer.main.get_command(app)
    for arg in args:
        # a group's subcommands by name (typer's groups are its own click's, not the click package's Group)
        commands = getattr(command, "commands", None)
        if commands is None or arg not in commands:
            break
        command = commands[arg]
    return any(param.name == "resume" for param in command.params)


def _stop_on_sigterm(signum, frame) -> None:
    """SIGTERM stops the run as Ctrl-C does: a KeyboardInterrupt where the process is, so that the
    trainer says where to resume from and nothing is half-written (the checkpoint writers are atomic)."""
    global _terminated
    _terminated = True
    raise KeyboardInterrupt


def catch_sigterm() -> None:
    """Install :func:`_stop_on_sigterm`, unless under a launcher: torchrun stops its processes with
    SIGTERM, and one waiting inside a collective would only answer it when that returns."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        signal.signal(signal.SIGTERM, _stop_on_sigterm)


def main() -> None:
    catch_sigterm()
    try:
        # Not standalone, so that DistilleryError reaches us; typer then *returns* the exit code of a
        # click Exit instead of exiting, including the 130 it makes of a KeyboardInterrupt.
        code = app(standalone_mode=False)
    except DistilleryError as e:
        typer.echo(f"distillery: error: {e}", err=True)
        sys.exit(2)
    except (*ABORTS, KeyboardInterrupt):
        code = 130
    except COMMAND_LINE_ERRORS as e:  # a malformed command line (click's own checks), or the help
        message = e.format_message().strip()
        if "\n" in message:  # `distillery` alone: the help text (rich help is printed before, message empty)
            e.show()
        elif message:
            typer.echo(f"distillery: error: {message}", err=True)
        sys.exit(e.exit_code)
    if isinstance(code, int) and code != 0:
        if code == 130:  # 128 + the signal, as a shell reports it
            code = 143 if _terminated else 130
            hint = RESUME_HINT if takes_resume(sys.argv[1:]) else RERUN_HINT
            typer.echo((TERMINATED if _terminated else INTERRUPTED) + hint, err=True)
        sys.exit(code)

