"""The methods' option flags, generated from their specs (each method package's ``options``).

``compress`` has a flag for every option a method marks ``flag`` (one flag per name, shared by the
methods that have the option); a step command (``distillery moebert convert``) has a flag for every
option of its method that names the step. :func:`with_option_flags` adds them to a Typer command by
extending its signature, which is what Typer reads; the command receives the given ones as one
``method_options`` dict (option name -> value). Help texts and defaults come from the specs.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

import typer

from distillery.method import METHODS, OptionInfo, method_data, method_options


@dataclass(frozen=True)
class OptionFlag:
    """One generated flag: the option it sets, and the methods that have it (with their specs)."""

    name: str  # the option's name (``lambda``)
    owners: tuple[tuple[str, OptionInfo], ...]  # (method, option) for every method with this option

    @property
    def info(self) -> OptionInfo:
        return self.owners[0][1]

    @property
    def param(self) -> str:  # the Python parameter of the command: never one of its own
        return f"option_{self.info.field}"

    def typer_option(self, with_methods: bool) -> Any:
        decl = self.info.flag_name
        if self.info.spec.check.kind is bool:
            decl = f"{decl}/--no-{decl[2:]}"
        return typer.Option(None, decl, help=self.help(with_methods))

    def annotation(self) -> Any:
        return Optional[self.info.spec.check.kind]

    def help(self, with_methods: bool) -> str:
        """The specs' help and defaults; with ``with_methods``, which methods take the option."""
        helps: dict[str, list[str]] = {}
        for method, info in self.owners:
            helps.setdefault(info.spec.help, []).append(method)
        if with_methods:
            text = "; ".join(f"{', '.join(methods)}: {words}" for words, methods in helps.items())
        else:
            text = "; ".join(helps)
            text = text[:1].upper() + text[1:]
        defaults: dict[str, list[str]] = {}
        for method, info in self.owners:
            defaults.setdefault(info.default_words(), []).append(method)
        if len(defaults) == 1:
            return f"{text}; default {next(iter(defaults))}."
        per_method = "; ".join(f"{words} for {', '.join(methods)}" for words, methods in defaults.items())
        return f"{text}; default {per_method}."


def option_flags(method: str | None = None, step: str | None = None) -> list[OptionFlag]:
    """``compress``'s flags (``method`` None: every method's options marked ``flag``), or the flags of
    ``method``'s ``step`` command."""
    owners: dict[str, list[tuple[str, OptionInfo]]] = {}
    for name in METHODS if method is None else [method]:
        for info in method_options(name).specs():
            owners.setdefault(info.name, []).append((name, info))
    wanted = (lambda info: info.spec.flag) if step is None else (lambda info: step in info.spec.steps)
    flags = [OptionFlag(name, tuple(found)) for name, found in owners.items() if any(wanted(i) for _, i in found)]
    for flag in flags:  # one flag, one type: methods sharing an option name share its kind of value
        kinds = {info.spec.check.kind for _, info in flag.owners}
        if len(kinds) > 1:
            raise TypeError(f"option {flag.name} is {' / '.join(k.__name__ for k in kinds)} in different methods")
    return flags


def flag_words(options: dict, method: str | None = None, step: str | None = None) -> dict[str, str]:
    """How the command line gave each of ``options`` (option name -> value: the option flags given, as
    :func:`with_option_flags` passes them, or a command's own parameters of an option's name), as a refusal
    names it: ``--kd-weight 0.1``, ``--no-refit``. For ``parse_options`` to refuse the same option in --option."""
    flags = {f.name: f.info.flag_name for f in option_flags(method, step)}

    def words(name: str, value: Any) -> str:
        flag = flags.get(name, "--" + name.replace("_", "-"))
        if isinstance(value, bool):
            return flag if value else f"--no-{flag[2:]}"
        return f"{flag} {value}"

    return {name: words(name, value) for name, value in options.items() if value is not None}


def with_option_flags(method: str | None = None, step: str | None = None) -> Callable:
    """Decorate a Typer command taking ``method_options: dict``: the options' flags (see
    :func:`option_flags`) are added to its parameters, and the ones given reach it in that dict."""
    return lambda command: OptionFlagsCommand(command, method, step)


class OptionFlagsCommand:
    """A Typer command whose signature, which Typer reads each time it builds the command line, is the
    command's own parameters and the option flags the specs give now."""

    def __init__(self, command: Callable, method: str | None, step: str | None):
        functools.update_wrapper(self, command)
        self.command, self.method, self.step = command, method, step

    def flags(self) -> list[OptionFlag]:
        flags = option_flags(self.method, self.step)
        own = {name.replace("_", "-") for name in self._own()}
        clash = [f.info.flag_name for f in flags if f.info.flag_name[2:] in own]
        if clash:
            raise TypeError(f"{self.command.__name__}: the option flags {clash} would hide the command's own")
        return flags

    def _own(self) -> dict[str, inspect.Parameter]:
        params = inspect.signature(self.command).parameters
        return {name: p for name, p in params.items() if name != "method_options"}

    @property
    def __signature__(self) -> inspect.Signature:
        generated = [inspect.Parameter(f.param, inspect.Parameter.KEYWORD_ONLY, default=f.typer_option(self.step is None),
                                       annotation=f.annotation()) for f in self.flags()]
        return inspect.Signature([*self._own().values(), *generated])

    def __call__(self, **kwargs):
        given = {f.name: kwargs.pop(f.param, None) for f in self.flags()}
        return self.command(**kwargs, method_options={k: v for k, v in given.items() if v is not None})


def preset_help() -> str:
    """``--preset``'s help: the methods' presets, from their YAML."""
    listed = []
    for name in METHODS:
        for preset, entry in (method_data(name).get("presets") or {}).items():
            listed.append(f"{name} {preset!r} ({entry.get('source', preset)} settings for the task)")
    return f"Method preset: {'; '.join(listed)}."
