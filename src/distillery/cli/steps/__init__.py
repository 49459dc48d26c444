"""The methods' step-by-step commands, one module per method that has them (``distillery <method> <step>``).

Each module defines ``app``, a Typer group that :mod:`distillery.cli` adds under the method's name; the
method options among a step's flags come from the method's specs (:func:`~distillery.cli.options.with_option_flags`).
"""
