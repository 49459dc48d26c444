"""`distillery cmow pretrain`: general distillation of a CMOW encoder on a text corpus."""

from __future__ import annotations

from typing import Optional

import typer

# Made before the command line's modules are imported: importing them builds the command line, which adds
# this app (a step module imported first is then still half made).
app = typer.Typer(no_args_is_help=True, help="CMOW/CBOW-Hybrid: general distillation on a text corpus.")

from distillery.cli.common import parse_options, setup_logging  # noqa: E402
from distillery.cli.options import flag_words, with_option_flags  # noqa: E402
from distillery.cmow.options import CMOWOptions  # noqa: E402
from distillery.config import BUILTIN_TEACHER, TrainConfig  # noqa: E402


@app.command("pretrain")
@with_option_flags("cmow", "pretrain")
def cmow_pretrain(
    out: str = typer.Option(..., help="Run folder; the encoder is saved to <out>/model."),
    corpus: list[str] = typer.Option(..., help="Text files (plain lines or WikiExtractor output); repeatable."),
    teacher: str = typer.Option(BUILTIN_TEACHER, help="minilm (built in, no MLM head: hidden-state distillation), a folder or a Hub id."),
    max_lines: Optional[int] = typer.Option(None, help="Read at most this many lines of text."),
    max_length: int = typer.Option(128, help="Tokens per MLM block."),
    epochs: float = typer.Option(1.0),
    max_steps: Optional[int] = typer.Option(None, help="Stop after this many optimizer steps."),
    batch_size: int = typer.Option(64),
    lr: float = typer.Option(5e-4, help="Adam learning rate, decayed linearly (Table 6's grid: 1e-3 … 1e-5)."),
    hidden_loss: str = typer.Option("mse", help="Teacher without an MLM head: mse or cosine on its last hidden state."),
    option: list[str] = typer.Option([], help="Model option key=value (component, bidirectional, matrix_dim, vector_dim, ...)."),
    seed: int = typer.Option(42),
    overwrite: bool = typer.Option(False),
    resume: bool = typer.Option(False, help="Continue from the last checkpoint in --out."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
    method_options: Optional[dict] = None,
):
    """General distillation (pretraining) of a CMOW/CBOW-Hybrid encoder: masked LM + distillation."""
    setup_logging(verbose)
    from distillery.cmow.pretrain import pretrain
    distillation = CMOWOptions.read(method_options)
    train = TrainConfig(epochs=epochs, max_steps=max_steps, batch_size=batch_size, lr=lr, weight_decay=0.0,
                        select_best=False, seed=seed, eval_every=None)
    folder = pretrain(corpus, out, teacher=teacher, train=train, max_lines=max_lines, max_length=max_length,
                      kd_weight=distillation.kd_weight, temperature=distillation.temperature, hidden_loss=hidden_loss,
                      model_options=parse_options(option, flag_words(method_options, "cmow", "pretrain")),
                      overwrite=overwrite, resume=resume)
    typer.echo(f"General-distilled CMOW encoder: {folder}\nUse it: distillery compress --method cmow --option init={folder}")
