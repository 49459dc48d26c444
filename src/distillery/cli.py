"""`distillery <command>`: parse options, build a config, call the stage. Nothing else lives here."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Optional

import click
import typer

from distillery.errors import DistilleryError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Distil a BERT-family teacher into a smaller, faster student, and measure both.")

DATA_HELP = "Folder with the standard GLUE/SQuAD layout (default: $DISTILLERY_DATA, else the Hub)."


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", force=True)
    # Under a launcher (RANK set by torchrun), the other processes say only what goes wrong.
    main = os.environ.get("RANK", "0") == "0"
    logging.getLogger("distillery").setLevel((logging.DEBUG if verbose else logging.INFO) if main else logging.WARNING)
    # transformers' and datasets' own chatter (load reports, per-map progress bars) hides ours.
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    for noisy in ("httpx", "urllib3", "filelock", "accelerate"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def parse_options(pairs: list[str]) -> dict:
    """``--option key=value`` pairs; values are read as YAML (numbers, lists, booleans)."""
    from distillery.config import parse_value

    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise DistilleryError(f"--option expects key=value, got {pair!r}.")
        key, value = pair.split("=", 1)
        key = key.strip().replace("-", "_")
        out[key] = parse_value(value, f"--option {key}")
    return out


def _compress_and_show(config, overwrite: bool, resume: bool = False, given: dict | None = None) -> None:
    """Run the pipeline on ``config`` and print its report and run folder (compress and the method steps)."""
    from distillery.pipeline import compress as run_compress

    import distillery.distributed as distributed

    folder = run_compress(config, overwrite=overwrite, resume=resume, given=given)
    if distributed.is_main():  # under a launcher, the others only trained
        typer.echo((folder / "report.md").read_text())
        typer.echo(f"Run folder: {folder}")


@app.command()
def compress(
    # None means "not given" (so that --resume can tell what was): the defaults are distill, sst2, minilm, quick
    method: Optional[str] = typer.Option(None, help="Compression method: distill (the layer-drop baseline, default), moebert, cmow or autotinybert."),
    task: Optional[str] = typer.Option(None, help="cola sst2 (default) mrpc stsb qqp mnli qnli rte wnli squad squad_v2 custom"),
    teacher: Optional[str] = typer.Option(None, help="minilm (built in, default), a local model folder or a Hub id."),
    teacher_finetuned: bool = typer.Option(False, help="The teacher already has this task's head: skip fine-tuning."),
    data_dir: Optional[str] = typer.Option(None, help=DATA_HELP),
    out: Optional[str] = typer.Option(None, help="Run folder (default runs/<task>-<method>-<time>)."),
    budget: Optional[str] = typer.Option(None, help="quick (minutes on a CPU, default) or full (paper-like)."),
    overwrite: bool = typer.Option(False, help="Replace an existing run folder (only one distillery wrote)."),
    resume: bool = typer.Option(False, help="Continue the run in --out from its last checkpoint."),
    student_layers: Optional[int] = typer.Option(None, help="distill: number of teacher layers the student keeps."),
    kd_weight: Optional[float] = typer.Option(None, help="distill, cmow, autotinybert: weight of the KD term (1 - kd_weight on the labels)."),
    temperature: Optional[float] = typer.Option(None, help="distill: softmax temperature of the KD loss."),
    hidden_weight: Optional[float] = typer.Option(None, help="distill: weight of hidden-state MSE (PKD); 0 = off."),
    experts: Optional[int] = typer.Option(None, help="moebert: number of experts N (default 4)."),
    expert_size: Optional[int] = typer.Option(None, help="moebert: neurons per expert d_e (default d_h/N)."),
    shared: Optional[int] = typer.Option(None, help="moebert: most important neurons shared by all experts (default d_h/6, a multiple of 8)."),
    split: Optional[str] = typer.Option(None, help="moebert: import (default), random or inverse."),
    routing: Optional[str] = typer.Option(None, help="moebert: hash-r (default), hash-b or gate."),
    shared_mode: Optional[str] = typer.Option(None, help="moebert: tied (one shared block, default) or cloned (the paper's copies)."),
    distill_layers: Optional[str] = typer.Option(None, help="moebert: all (default), last, skip or none."),
    lam: Optional[float] = typer.Option(None, "--lambda", help="moebert: weight of the layer-wise distillation loss."),
    balance_weight: Optional[float] = typer.Option(None, help="moebert gate: weight of the load-balancing loss."),
    importance_examples: Optional[int] = typer.Option(None, help="moebert: training examples sampled for the importance scores."),
    refit: Optional[bool] = typer.Option(None, "--refit/--no-refit", help="moebert: least-squares refit of the experts' output weights after conversion (default on, off for QA; --no-refit: the paper's conversion)."),
    speedup: Optional[float] = typer.Option(None, help="autotinybert: latency budget as a speed-up over the teacher measured here (default 2)."),
    preset: Optional[str] = typer.Option(None, help="Method preset: moebert 'paper' (Table 7 settings for the task)."),
    option: list[str] = typer.Option([], "--option", help="Method option key=value (repeatable)."),
    epochs: Optional[float] = typer.Option(None, help="Student epochs (default from the budget)."),
    lr: Optional[float] = typer.Option(None, help="Student learning rate."),
    batch_size: Optional[int] = typer.Option(None, help="Student batch size."),
    teacher_epochs: Optional[float] = typer.Option(None, help="Teacher fine-tuning epochs."),
    max_length: Optional[int] = typer.Option(None, help="Maximum tokens per example."),
    train_limit: Optional[int] = typer.Option(None, help="Use at most this many training examples."),
    dev_limit: Optional[int] = typer.Option(None, help="Score on the first N dev examples only (smoke runs)."),
    squad_holdout: Optional[float] = typer.Option(None, help="SQuAD without a train file: hold out this fraction of dev articles for evaluation, train on the rest."),
    train_file: Optional[str] = typer.Option(None, help="custom: training CSV/TSV/JSONL."),
    dev_file: Optional[str] = typer.Option(None, help="custom: dev CSV/TSV/JSONL."),
    text_column: Optional[str] = typer.Option(None, help="custom: column of the text."),
    text_pair_column: Optional[str] = typer.Option(None, help="custom: column of the second text of a pair."),
    label_column: Optional[str] = typer.Option(None, help="custom: column of the label."),
    regression: bool = typer.Option(False, help="custom: the label is a number to regress."),
    seed: Optional[int] = typer.Option(None, help="Random seed."),
    latency_runs: Optional[int] = typer.Option(None, help="Benchmark: timed runs at 1x128."),
    export: list[str] = typer.Option([], "--export", help="Also export, score and measure teacher and student as onnx, onnx-int8, torch-int8 or int8 (repeatable)."),
    config_file: Optional[str] = typer.Option(None, "--config", help="A YAML file of settings in config.yaml's shape (method, data: {task: ...}, student: {lr: ...}, method_options: {...}); flags override it."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
):
    """Fine-tune (or reuse) the teacher, build and train the student, evaluate, benchmark, report."""
    setup_logging(verbose)
    from distillery.config import dotted_settings, read_yaml_mapping
    from distillery.pipeline import build_run_config

    method_options = parse_options(option)
    for key, value in (("student_layers", student_layers), ("kd_weight", kd_weight), ("temperature", temperature),
                       ("hidden_weight", hidden_weight), ("experts", experts), ("expert_size", expert_size),
                       ("shared", shared), ("split", split), ("routing", routing), ("shared_mode", shared_mode),
                       ("distill_layers", distill_layers), ("lambda", lam), ("balance_weight", balance_weight),
                       ("importance_examples", importance_examples), ("refit", refit), ("speedup", speedup)):
        if value is not None:
            method_options[key] = value
    overrides = {
        "teacher.finetuned": teacher_finetuned or None,
        "student.epochs": epochs, "student.lr": lr, "student.batch_size": batch_size,
        "student.seed": seed, "teacher.train.seed": seed, "data.seed": seed,
        "teacher.train.epochs": teacher_epochs,
        "data.max_length": max_length, "data.train_limit": train_limit, "data.dev_limit": dev_limit,
        "data.squad_holdout": squad_holdout, "data.train_file": train_file, "data.dev_file": dev_file,
        "data.text_column": text_column, "data.text_pair_column": text_pair_column,
        "data.label_column": label_column, "data.regression": regression or None,
        "bench.latency_runs": latency_runs,
        "export": list(export) or None,
    }
    overrides.update({f"method_options.{k}": v for k, v in method_options.items()})
    # the settings file first (torchtune-style), then every flag given on the command line over it
    file = dotted_settings(read_yaml_mapping(config_file)) if config_file else {}
    method, task, budget = method or file.pop("method", None), task or file.pop("data.task", None), budget or file.pop("budget", None)
    teacher, data_dir, out = teacher or file.pop("teacher.name", None), data_dir or file.pop("data.data_dir", None), out or file.pop("out", None)
    for key in ("method", "data.task", "budget", "teacher.name", "data.data_dir", "out"):
        file.pop(key, None)  # given on the command line too: the flag won
    overrides = {**file, **{k: v for k, v in overrides.items() if v is not None}}
    try:
        config = build_run_config(method=method or "distill", task=task or "sst2", budget=budget or "quick",
                                  teacher=teacher or "minilm", data_dir=data_dir, out=out, overrides=overrides,
                                  preset=preset)
    except DistilleryError as e:
        raise DistilleryError(f"{e} (settings from the command line and {config_file})" if config_file else str(e)) from None
    given = {**overrides, "method": method, "data.task": task, "budget": budget, "teacher.name": teacher,
             "data.data_dir": data_dir}
    if preset:  # a preset's settings count as given
        from distillery.recipe import get_method

        given.update(get_method(config.method).preset_overrides(preset, config.data.task))
    _compress_and_show(config, overwrite, resume, given)


@app.command("teacher")
def teacher_cmd(
    task: str = typer.Option("sst2"),
    teacher: str = typer.Option("minilm", help="minilm (built in), a local model folder or a Hub id."),
    data_dir: Optional[str] = typer.Option(None, help=DATA_HELP),
    budget: str = typer.Option("quick"),
    out: Optional[str] = typer.Option(None, help="Also save the fine-tuned teacher here."),
    overwrite: bool = typer.Option(False, help="Replace an existing --out folder written by distillery."),
    epochs: Optional[float] = typer.Option(None),
    lr: Optional[float] = typer.Option(None),
    max_length: Optional[int] = typer.Option(None),
    train_limit: Optional[int] = typer.Option(None),
    squad_holdout: Optional[float] = typer.Option(None),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
):
    """Fine-tune the teacher on a task (cached), score it on dev, optionally save a copy."""
    setup_logging(verbose)
    from distillery.data.loading import task_for
    from distillery.folders import check_target
    from distillery.modeling import save_model
    from distillery.pipeline import build_run_config, run_inputs
    from distillery.teacher import get_finetuned_teacher

    config = build_run_config(task=task, budget=budget, teacher=teacher, data_dir=data_dir, overrides={
        "teacher.train.epochs": epochs, "teacher.train.lr": lr, "data.max_length": max_length,
        "data.train_limit": train_limit, "data.squad_holdout": squad_holdout})
    if out:  # checked before the fine-tuning, not after it
        check_target(out, overwrite=overwrite, inputs=run_inputs(config), kind="model")
    model, tokenizer, info = get_finetuned_teacher(config.teacher, task_for(config.data), config.data)
    if out:
        save_model(model, tokenizer, Path(out), kind="teacher")
        info["saved_to"] = out
    typer.echo(json.dumps(info, indent=2))


@app.command("eval")
def eval_cmd(
    model: str = typer.Argument(..., help="A saved model folder or a run folder."),
    task: str = typer.Option("sst2"),
    data_dir: Optional[str] = typer.Option(None, help=DATA_HELP),
    split: str = typer.Option("dev"),
    max_length: int = typer.Option(128),
    squad_holdout: Optional[float] = typer.Option(None),
    out: Optional[str] = typer.Option(None, help="Write the metrics JSON here too."),
):
    """Score a saved model on a task's dev split; prints metrics JSON."""
    setup_logging()
    from distillery.evaluation import evaluate

    metrics = evaluate(model, task, data_dir=data_dir, split=split, max_length=max_length, squad_holdout=squad_holdout)
    text = json.dumps(metrics, indent=2)
    if out:
        Path(out).write_text(text)
    typer.echo(text)


@app.command()
def bench(
    models: list[str] = typer.Argument(..., help="Model folders (run folders use their student/); the first is the reference."),
    threads: Optional[int] = typer.Option(None, help="torch threads (default: torch's)."),
    latency_runs: int = typer.Option(30),
    throughput_runs: int = typer.Option(3),
    out: Optional[str] = typer.Option(None, help="Write bench JSON here too."),
    export: list[str] = typer.Option([], "--export", help="Also measure each model exported as onnx, onnx-int8, torch-int8 or int8 (repeatable)."),
):
    """Latency (1x128) and throughput (256x64) of several models, interleaved in one process."""
    setup_logging()
    from distillery.bench import benchmark, format_bench_table
    from distillery.modeling import model_folder
    from distillery.runtime import load_model

    loaded = {}
    for i, path in enumerate(models):
        name = "teacher" if i == 0 else ("student" if len(models) == 2 else Path(path).name or f"model{i}")
        loaded[name] = load_model(path)
    if export:
        from transformers import AutoTokenizer

        from distillery.export import build_variants

        sources = {name: (m, AutoTokenizer.from_pretrained(model_folder(p))) for (name, m), p in zip(loaded.items(), models)}
        loaded.update(build_variants(sources, export)[0])
    result = benchmark(loaded, threads=threads, latency_runs=latency_runs, throughput_runs=throughput_runs)
    text = json.dumps(result, indent=2)
    if out:
        Path(out).write_text(text)
    typer.echo(format_bench_table(result))
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
                          squad_holdout=squad_holdout)
    manifest = read_manifest(folder)
    summary = {k: manifest[k] for k in ("format", "backend", "exporter", "parity", "scores", "recovery") if k in manifest}
    typer.echo(json.dumps(summary, indent=2))
    typer.echo(f"Export folder: {folder}")


@app.command()
def report(
    runs: list[str] = typer.Argument(..., help="One run folder, or several runs of one task to compare."),
    out: Optional[str] = typer.Option(None, help="Several runs: folder for the merged report (default runs/comparison-<task>)."),
):
    """Rewrite a run's report.md and plot.png; with several runs, one merged table and Pareto plot."""
    setup_logging()
    from distillery.report import merge_runs, write_report

    if len(runs) == 1:
        path = write_report(Path(runs[0]))
    else:
        if out is None:
            from distillery.report import load_run

            out = f"runs/comparison-{load_run(runs[0])['metrics'].get('task', 'task')}"
        path = merge_runs([Path(r) for r in runs], Path(out))
    typer.echo(path.read_text() if path.suffix == ".md" else f"Wrote {path}")


moebert_app = typer.Typer(no_args_is_help=True, help="MoEBERT step by step: importance, convert, train.")
app.add_typer(moebert_app, name="moebert")


def _moebert_config(task, teacher, data_dir, budget, squad_holdout, method_options, seed=None):
    from distillery.pipeline import build_run_config

    return build_run_config(method="moebert", task=task, budget=budget, teacher=teacher, data_dir=data_dir, overrides={
        "data.squad_holdout": squad_holdout, "student.seed": seed, "data.seed": seed,
        **{f"method_options.{k}": v for k, v in method_options.items()}})


@moebert_app.command("importance")
def moebert_importance(
    task: str = typer.Option("sst2"),
    teacher: str = typer.Option("minilm", help="minilm (built in), a local model folder or a Hub id."),
    data_dir: Optional[str] = typer.Option(None, help=DATA_HELP),
    budget: str = typer.Option("quick", help="Budget of the teacher fine-tuning (cached)."),
    importance_examples: Optional[int] = typer.Option(None, help="Training examples sampled (default 2048)."),
    squad_holdout: Optional[float] = typer.Option(None),
    out: str = typer.Option("importance.safetensors", help="Where to write the scores."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
):
    """Importance of every FFN neuron (Eq. 4) of the fine-tuned teacher, on the task's train split."""
    setup_logging(verbose)
    from distillery.moebert.recipe import importance_step

    opts = {"importance_examples": importance_examples} if importance_examples is not None else {}
    path = importance_step(_moebert_config(task, teacher, data_dir, budget, squad_holdout, opts), out)
    typer.echo(f"Importance scores: {path}")


@moebert_app.command("convert")
def moebert_convert(
    out: str = typer.Option(..., help="Folder for the converted (untrained) MoEBERT model."),
    importance: Optional[str] = typer.Option(None, help="Scores from `distillery moebert importance` (default: computed now)."),
    task: str = typer.Option("sst2"),
    teacher: str = typer.Option("minilm", help="minilm (built in), a local model folder or a Hub id."),
    data_dir: Optional[str] = typer.Option(None, help=DATA_HELP),
    budget: str = typer.Option("quick", help="Budget of the teacher fine-tuning (cached)."),
    experts: Optional[int] = typer.Option(None, help="Number of experts N (default 4)."),
    expert_size: Optional[int] = typer.Option(None, help="Neurons per expert d_e (default d_h/N)."),
    shared: Optional[int] = typer.Option(None, help="Shared neurons s (default d_h/6, a multiple of 8)."),
    split: Optional[str] = typer.Option(None, help="import (default), random or inverse."),
    routing: Optional[str] = typer.Option(None, help="hash-r (default), hash-b or gate."),
    shared_mode: Optional[str] = typer.Option(None, help="tied (default) or cloned."),
    refit: Optional[bool] = typer.Option(None, "--refit/--no-refit", help="Least-squares refit of the experts' output weights on the train sample (default on, off for QA)."),
    squad_holdout: Optional[float] = typer.Option(None),
    seed: Optional[int] = typer.Option(None, help="Seed of the random split and the hash tables."),
    overwrite: bool = typer.Option(False),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
):
    """Cut the fine-tuned teacher's FFNs into experts and save the MoEBERT model (before training)."""
    setup_logging(verbose)
    from distillery.moebert.recipe import convert_step

    opts = {k: v for k, v in (("experts", experts), ("expert_size", expert_size), ("shared", shared), ("split", split),
                              ("routing", routing), ("shared_mode", shared_mode), ("refit", refit)) if v is not None}
    config = _moebert_config(task, teacher, data_dir, budget, squad_holdout, opts, seed)
    path = convert_step(config, importance, out, overwrite=overwrite)
    typer.echo(f"Converted MoEBERT model: {path}")


@moebert_app.command("train")
def moebert_train(
    init: str = typer.Option(..., help="A converted model folder (`distillery moebert convert`)."),
    task: str = typer.Option("sst2"),
    teacher: str = typer.Option("minilm", help="The dense teacher the model was converted from."),
    data_dir: Optional[str] = typer.Option(None, help=DATA_HELP),
    budget: str = typer.Option("quick"),
    out: Optional[str] = typer.Option(None, help="Run folder (default runs/<task>-moebert-<time>)."),
    distill_layers: Optional[str] = typer.Option(None, help="all (default), last, skip or none."),
    lam: Optional[float] = typer.Option(None, "--lambda", help="Weight of the layer-wise distillation loss."),
    balance_weight: Optional[float] = typer.Option(None, help="gate: weight of the load-balancing loss."),
    preset: Optional[str] = typer.Option(None, help="'paper': Table 7 settings for the task."),
    epochs: Optional[float] = typer.Option(None),
    lr: Optional[float] = typer.Option(None),
    batch_size: Optional[int] = typer.Option(None),
    squad_holdout: Optional[float] = typer.Option(None),
    overwrite: bool = typer.Option(False),
    resume: bool = typer.Option(False),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
):
    """Layer-wise distillation of a converted model; writes a run folder like `compress`."""
    setup_logging(verbose)
    from distillery.pipeline import build_run_config

    options = {k: v for k, v in (("init", init), ("distill_layers", distill_layers), ("lambda", lam),
                                 ("balance_weight", balance_weight)) if v is not None}
    config = build_run_config(method="moebert", task=task, budget=budget, teacher=teacher, data_dir=data_dir, out=out,
                              preset=preset, overrides={
                                  "student.epochs": epochs, "student.lr": lr, "student.batch_size": batch_size,
                                  "data.squad_holdout": squad_holdout,
                                  **{f"method_options.{k}": v for k, v in options.items()}})
    _compress_and_show(config, overwrite, resume)


cmow_app = typer.Typer(no_args_is_help=True, help="CMOW/CBOW-Hybrid: general distillation on a text corpus.")
app.add_typer(cmow_app, name="cmow")


@cmow_app.command("pretrain")
def cmow_pretrain(
    out: str = typer.Option(..., help="Run folder; the encoder is saved to <out>/model."),
    corpus: list[str] = typer.Option(..., help="Text files (plain lines or WikiExtractor output); repeatable."),
    teacher: str = typer.Option("minilm", help="minilm (built in, no MLM head: hidden-state distillation), a folder or a Hub id."),
    max_lines: Optional[int] = typer.Option(None, help="Read at most this many lines of text."),
    max_length: int = typer.Option(128, help="Tokens per MLM block."),
    epochs: float = typer.Option(1.0),
    max_steps: Optional[int] = typer.Option(None, help="Stop after this many optimizer steps."),
    batch_size: int = typer.Option(64),
    lr: float = typer.Option(5e-4, help="Adam learning rate, decayed linearly (Table 6's grid: 1e-3 … 1e-5)."),
    kd_weight: float = typer.Option(0.5, help="Weight of the distillation term; 1 − kd_weight on the MLM loss."),
    temperature: float = typer.Option(1.0, help="Softmax temperature of the MLM-distribution distillation."),
    hidden_loss: str = typer.Option("mse", help="Teacher without an MLM head: mse or cosine on its last hidden state."),
    option: list[str] = typer.Option([], help="Model option key=value (component, bidirectional, matrix_dim, vector_dim, ...)."),
    seed: int = typer.Option(42),
    overwrite: bool = typer.Option(False),
    resume: bool = typer.Option(False, help="Continue from the last checkpoint in --out."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
):
    """General distillation (pretraining) of a CMOW/CBOW-Hybrid encoder: masked LM + distillation."""
    setup_logging(verbose)
    from distillery.cmow.pretrain import pretrain
    from distillery.config import TrainConfig

    model_options = parse_options(option)
    train = TrainConfig(epochs=epochs, max_steps=max_steps, batch_size=batch_size, lr=lr, weight_decay=0.0,
                        select_best=False, seed=seed, eval_every=None)
    try:
        folder = pretrain(corpus, out, teacher=teacher, train=train, max_lines=max_lines, max_length=max_length,
                          kd_weight=kd_weight, temperature=temperature, hidden_loss=hidden_loss, model_options=model_options,
                          overwrite=overwrite, resume=resume)
    except (ValueError, TypeError) as e:  # a bad model option, from the config's own check
        raise DistilleryError(str(getattr(e, "__cause__", None) or e)) from None
    typer.echo(f"General-distilled CMOW encoder: {folder}\nUse it: distillery compress --method cmow --option init={folder}")


atb_app = typer.Typer(no_args_is_help=True, help="AutoTinyBERT step by step: supernet, latency, search, extract, train (all in one: compress --method autotinybert).")
app.add_typer(atb_app, name="autotinybert")


@atb_app.command("supernet")
def atb_supernet(
    out: str = typer.Option(..., help="Run folder; the super-net is saved to <out>/supernet."),
    corpus: list[str] = typer.Option(..., help="Text files (plain lines or WikiExtractor output); repeatable."),
    teacher: str = typer.Option("minilm", help="The BERT the super-net is cut from and distilled from."),
    strategy: str = typer.Option("head-dims", help="Attention sub-matrices: heads or head-dims."),
    samples: int = typer.Option(3, help="Sub-networks per batch (Algorithm 1's M)."),
    max_lines: Optional[int] = typer.Option(None),
    max_length: int = typer.Option(128),
    max_steps: Optional[int] = typer.Option(None),
    epochs: float = typer.Option(1.0),
    batch_size: int = typer.Option(32),
    lr: float = typer.Option(1e-5),
    seed: int = typer.Option(42),
    overwrite: bool = typer.Option(False),
    resume: bool = typer.Option(False),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
):
    """One-shot training of a super-net by distillation on a corpus (Algorithm 1, KD setting)."""
    setup_logging(verbose)
    from distillery.autotinybert.oneshot import train_supernet
    from distillery.config import TrainConfig

    train = TrainConfig(epochs=epochs, max_steps=max_steps, batch_size=batch_size, lr=lr, warmup_ratio=0.1,
                        select_best=False, seed=seed)
    folder = train_supernet(corpus, out, teacher=teacher, strategy=strategy, train=train, samples=samples,
                            max_lines=max_lines, max_length=max_length, overwrite=overwrite, resume=resume)
    typer.echo(f"Super-net: {folder}")


@atb_app.command("latency")
def atb_latency(
    supernet: str = typer.Option(..., help="A super-net folder (from `autotinybert supernet`)."),
    out: str = typer.Option("latency.json", help="Where to write the measurements and the predictor."),
    archs: int = typer.Option(150, help="Architectures to sample and time."),
    runs: int = typer.Option(15, help="Timed runs per architecture."),
    batch: int = typer.Option(1),
    seq: int = typer.Option(128),
    threads: Optional[int] = typer.Option(None, help="torch threads while timing (default: as set)."),
    seed: int = typer.Option(0),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
):
    """Time sampled architectures as standalone models on this machine; fit and save the predictor."""
    setup_logging(verbose)
    import random

    from distillery.autotinybert.latency import fit_predictor, measure, save_predictor
    from distillery.autotinybert.oneshot import load_supernet

    net = load_supernet(supernet)
    sampled = net.space.sample_distinct(archs, random.Random(seed))
    ms = measure(net, sampled, shape=(batch, seq), runs=runs, threads=threads)
    predictor, report = fit_predictor(net.space, sampled, ms, seed=seed)
    path = save_predictor(out, predictor, report, sampled, ms, (batch, seq), threads)
    typer.echo(f"Held-out MAPE {report['mape_mlp']:.1f} % (FLOP baseline {report['mape_flops']:.1f} %) on "
               f"{report['test']} architectures; saved {path}")


@atb_app.command("extract")
def atb_extract(
    supernet: str = typer.Option(..., help="A super-net folder (from `autotinybert supernet`)."),
    arch: str = typer.Option(..., help="l,d_m,d_f,h,d_qkv"),
    out: str = typer.Option(..., help="Folder for the standalone model (safetensors + tokenizer)."),
    overwrite: bool = typer.Option(False, help="Replace an existing model folder written by distillery."),
):
    """Cut one architecture out of a super-net as a standalone AutoTinyBERT model."""
    setup_logging(False)
    from transformers import AutoTokenizer

    from distillery.autotinybert.oneshot import load_supernet
    from distillery.autotinybert.recipe import parse_arch

    from distillery.folders import check_target
    from distillery.modeling import save_model

    check_target(out, overwrite=overwrite, inputs=[supernet], kind="model")
    net = load_supernet(supernet)
    model = net.extract(parse_arch(arch))
    save_model(model, AutoTokenizer.from_pretrained(supernet), Path(out))
    typer.echo(f"{parse_arch(arch)} → {out}")


def _atb_run(task: str, teacher: str, data_dir, out, budget: str, options: dict, extra: list[str], overwrite: bool,
             verbose: bool) -> None:
    setup_logging(verbose)
    options = {**options, **parse_options(extra)}
    from distillery.pipeline import build_run_config

    config = build_run_config(method="autotinybert", task=task, budget=budget, teacher=teacher, data_dir=data_dir, out=out,
                              overrides={f"method_options.{k}": v for k, v in options.items() if v is not None})
    _compress_and_show(config, overwrite)


@atb_app.command("search")
def atb_search(
    task: str = typer.Option("sst2"),
    supernet: Optional[str] = typer.Option(None, help="A super-net trained on the task (a run's supernet/); default: train one here."),
    speedup: Optional[float] = typer.Option(None, help="Budget as a speed-up over the teacher measured here (default 2)."),
    budget_ms: Optional[float] = typer.Option(None, help="Budget in ms at 1x128 (instead of --speedup)."),
    evaluator: str = typer.Option("proxy", help="proxy (KD loss in the super-net) or finetune (short fine-tune, held-out train score)."),
    backend: str = typer.Option("evolution", help="evolution (Algorithm 2) or optuna (NSGA-II)."),
    teacher: str = typer.Option("minilm"),
    data_dir: Optional[str] = typer.Option(None, help=DATA_HELP),
    out: Optional[str] = typer.Option(None, help="Run folder (search.json, search.png, latency.json, architecture.json, student/)."),
    budget: str = typer.Option("quick"),
    option: list[str] = typer.Option([], "--option", help="Other autotinybert option key=value (repeatable)."),
    overwrite: bool = typer.Option(False),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
):
    """Time architectures, fit the predictor, search under the budget; the chosen sub-network is extracted,
    scored and measured as is (no further training)."""
    _atb_run(task, teacher, data_dir, out, budget, {"supernet": supernet, "speedup": speedup, "budget_ms": budget_ms,
             "evaluator": evaluator, "search_backend": backend, "further_training": False}, option, overwrite, verbose)


@atb_app.command("train")
def atb_train(
    supernet: str = typer.Option(..., help="The super-net to extract from (a run's supernet/)."),
    arch: str = typer.Option(..., help="l,d_m,d_f,h,d_qkv (a search's architecture.json), or fast / conventional."),
    task: str = typer.Option("sst2"),
    speedup: Optional[float] = typer.Option(None, help="fast / conventional: the budget as a speed-up (default 2)."),
    teacher: str = typer.Option("minilm"),
    data_dir: Optional[str] = typer.Option(None, help=DATA_HELP),
    out: Optional[str] = typer.Option(None),
    budget: str = typer.Option("quick"),
    option: list[str] = typer.Option([], "--option", help="Other autotinybert option key=value (repeatable)."),
    overwrite: bool = typer.Option(False),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
):
    """Extract an architecture from a trained super-net and train it further on the task (CE + KD)."""
    _atb_run(task, teacher, data_dir, out, budget, {"supernet": supernet, "arch": arch, "speedup": speedup},
             option, overwrite, verbose)


# typer >= 0.20 carries its own copy of click, whose exceptions are not click's.
COMMAND_LINE_ERRORS = tuple({click.ClickException, getattr(typer, "TyperException", click.ClickException)})
ABORTS = tuple({click.exceptions.Abort, typer.Abort})
INTERRUPTED = "distillery: interrupted. Rerun with --resume to continue from the last checkpoint."


def main() -> None:
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
        if code == 130:
            typer.echo(INTERRUPTED, err=True)
        sys.exit(code)


if __name__ == "__main__":
    main()
