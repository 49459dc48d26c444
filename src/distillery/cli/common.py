"""What every command shares: the Typer app, logging, ``--option`` parsing, running and showing a run."""

from __future__ import annotations

import logging
import os

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


def compress_and_show(config, overwrite: bool, resume: bool = False, given: dict | None = None) -> None:
    """Run the pipeline on ``config`` and print its report and run folder (compress and the method steps)."""
    from distillery.pipeline import compress as run_compress

    import distillery.distributed as distributed

    folder = run_compress(config, overwrite=overwrite, resume=resume, given=given)
    if distributed.is_main():  # under a launcher, the others only trained
        typer.echo((folder / "report.md").read_text())
        typer.echo(f"Run folder: {folder}")
