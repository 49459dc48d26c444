"""`distillery push RUN REPO`: a finished run's student, with its model card, to the Hugging Face Hub."""

from __future__ import annotations

from typing import Optional

import typer

from distillery.card import push_student
from distillery.cli.common import app, setup_logging


@app.command("push")
def push(
    run: str = typer.Argument(..., help="A run folder (its student/ is uploaded)."),
    repo: str = typer.Argument(..., help="Hugging Face Hub repository, user/name (created when missing)."),
    private: Optional[bool] = typer.Option(None, "--private/--public", help="Visibility of a repository created here."),
):
    """Upload a run's student/ (weights, tokenizer, weights record, model card) to the Hugging Face Hub."""
    setup_logging()
    typer.echo(f"Pushed the student to {push_student(run, repo, private=private)}")
