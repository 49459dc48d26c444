"""What every command shares: the Typer app, logging, ``--option`` parsing, running and showing a run."""

from __future__ import annotations

import logging
import os
import sys
from typing import Annotated, Optional

import typer

from distillery.config import parse_value
from distillery.errors import DistilleryError
from distillery.report_parts import deploy_path, deploy_sentence, student_names
from distillery.run_record import load_run

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Distil a BERT-family teacher into a smaller, faster student, and measure both.")

DATA_HELP = "Folder with the standard GLUE/SQuAD layout (default: $DISTILLERY_DATA, else the Hub)."

# The options of task "custom" (your own files): one definition for every command that reads task data.
TrainFile = Annotated[Optional[str], typer.Option(help="custom: training CSV/TSV/JSONL.")]
DevFile = Annotated[Optional[str], typer.Option(help="custom: dev CSV/TSV/JSONL (the examples scored).")]
UnlabeledFile = Annotated[Optional[str], typer.Option(help="In-domain text without labels (CSV/TSV/JSONL, one text or pair a row, in the task's own columns, else text and text_pair; a token task: JSON lines of tokens, or one word a line with a blank line between sentences): the teacher labels it and the student trains on it too (--task embedding: the only text it learns from).")]
# the run's extras (RunConfig.baselines, RunConfig.int8), on every command that writes a run folder
Baselines = Annotated[Optional[bool], typer.Option("--baselines/--no-baselines", help="Measure the free baselines beside teacher and student: the teacher's int8 copy and static embeddings distilled from it (default on).")]
Int8 = Annotated[Optional[bool], typer.Option("--int8/--no-int8", help="Export the student to int8 (the faster backend), score it and measure it beside the student; the verdict weighs both (default on).")]
TextColumn = Annotated[Optional[str], typer.Option(help="custom: column of the text (default text).")]
TextPairColumn = Annotated[Optional[str], typer.Option(help="custom: column of the second text of a pair.")]
LabelColumn = Annotated[Optional[str], typer.Option(help="custom: column of the label (default label).")]
Regression = Annotated[bool, typer.Option(help="custom: the label is a number to regress.")]
TokenColumn = Annotated[Optional[int], typer.Option(help="custom token classification: the 0-based column of the word in a CoNLL-style file (default 0).")]
TagColumn = Annotated[Optional[int], typer.Option(help="custom token classification: the 0-based column of the word's IOB tag in a CoNLL-style file (default the last).")]
Pooling = Annotated[Optional[str], typer.Option(help="--task embedding: how the teacher's sentence vector is read from its last hidden states, as sentence-transformers' Pooling modes: mean, cls (the first token's), max, mean_sqrt_len_tokens, weightedmean or lasttoken; a sentence-transformers teacher's own files decide it (given, it must agree); a plain encoder is mean-pooled unless told otherwise. Its student pools the same way.")]
LabelAllSubwords = Annotated[bool, typer.Option(help="token classification: train on every sub-word of a word (B-X continuing as I-X), not only its first; dev is scored on first sub-words either way.")]


def custom_data(train_file: str | None = None, dev_file: str | None = None, text_column: str | None = None,
                text_pair_column: str | None = None, label_column: str | None = None,
                regression: bool = False, token_column: int | None = None, tag_column: int | None = None) -> dict:
    """The custom-data options as DataConfig settings (field -> value; None: not given)."""
    return {"train_file": train_file, "dev_file": dev_file, "text_column": text_column,
            "text_pair_column": text_pair_column, "label_column": label_column, "regression": regression or None,
            "token_column": token_column, "tag_column": tag_column}


class CurrentStderr(logging.StreamHandler):
    """A handler that writes to ``sys.stderr`` as it is when a line is logged, not as it was when logging was set up:
    a stream redirected or captured since (a second command in one process, a test) still gets the line."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass  # always the current sys.stderr


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", force=True,
                        handlers=[CurrentStderr()])
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


def parse_options(pairs: list[str], given: dict[str, str] | None = None) -> dict:
    """``--option key=value`` pairs; values are read as YAML (numbers, lists, booleans). A key given twice, by
    two pairs or by a pair and an entry of ``given`` (key -> how the command line gave it otherwise, as
    :func:`distillery.cli.options.flag_words` writes it: ``--kd-weight 0.1``), is refused naming both, as a
    settings file's key written twice is: neither the first nor the last may silently win."""
    out, seen = {}, dict(given or {})
    for pair in pairs or []:
        if "=" not in pair:
            raise DistilleryError(f"--option expects key=value, got {pair!r}.")
        key, value = pair.split("=", 1)
        key = key.strip().replace("-", "_")
        if key in seen:
            raise DistilleryError(f"{key} is given twice: {seen[key]} and --option {pair}; give it once.")
        seen[key] = f"--option {pair}"
        out[key] = parse_value(value, f"--option {key}")
    return out


def given_on_command_line(context: typer.Context) -> set[str]:
    """The parameters of the running command (its ``typer.Context``) that its command line gave, rather than
    left at their defaults: a step command's settings that its --resume must not change, where a default
    value cannot say that it was not given."""
    sources = {name: context.get_parameter_source(name) for name in context.params}
    return {name for name, source in sources.items() if source is not None and source.name not in ("DEFAULT",
                                                                                                     "DEFAULT_MAP")}


def deploy_line(folder) -> str | None:
    """The run's sentence on what to deploy (report_parts.deploy_sentence) with the path of the folder it
    names, or None where no baseline was measured."""
    run = load_run(folder)
    return deploy_sentence(run.bench, run.metrics,
                           paths={n: str(folder / deploy_path(n)) for n in student_names(run.bench)})


def compress_and_show(config, overwrite: bool, resume: bool = False, given: dict | None = None,
                      push_to_hub: str | None = None) -> None:
    """Run the pipeline on ``config`` and print its report and run folder (compress and the method steps);
    with ``push_to_hub``, upload the student there (checked before anything trains)."""
    from distillery.pipeline import compress as run_compress

    import distillery.distributed as distributed

    if push_to_hub:
        from distillery.card import check_push

        check_push(push_to_hub)
    folder = run_compress(config, overwrite=overwrite, resume=resume, given=given)
    if distributed.is_main():  # under a launcher, the others only trained
        typer.echo((folder / "report.md").read_text())
        typer.echo(f"Run folder: {folder}")
        deploy = deploy_line(folder)
        if deploy:  # the report's answer, last on the screen
            typer.echo(deploy)
        if push_to_hub:
            from distillery.card import push_student

            typer.echo(f"Pushed the student to {push_student(folder, push_to_hub)}")
