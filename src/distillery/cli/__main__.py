"""`python -m distillery.cli` (what `accelerate launch -m distillery.cli` runs)."""

from distillery.cli import main

main()
