"""The option tables of docs/ from the methods' specs: ``python -m distillery.cli.docs`` rewrites them,
``--check`` only says which are out of date (exit 1).

Each table sits between two marker lines, ``<!-- options: NAME -->`` and ``<!-- /options: NAME -->``:
NAME is a method (docs/<method>.md: every option of the method) or ``compress`` (docs/cli.md: the
methods' flags of ``distillery compress``). The text between them is replaced; nothing else is touched.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from distillery.cli.options import option_flags
from distillery.method import METHODS, OptionInfo, method_options

DOCS = Path(__file__).resolve().parents[3] / "docs"
# the page of each table
PAGES = {"compress": "cli.md", **{name: f"{name}.md" for name in METHODS}}


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def _flag_cell(method: str, info: OptionInfo) -> str:
    """The flag and the commands that take it, or ``--option name=…`` where no command has a flag for it."""
    commands = (["compress"] if info.spec.flag else []) + [f"`{method} {step}`" for step in info.spec.steps]
    if not commands:
        return f"`--option {info.name}=…`"
    flag = info.flag_name + (f"/--no-{info.flag_name[2:]}" if info.spec.check.kind is bool else "")
    return f"`{flag}`: {', '.join(commands)}"


def method_table(method: str) -> str:
    """Every option of ``method``: its name, flag, default, accepted values, meaning and paper's name."""
    rows = ["| option | flag | default | accepts | what | paper |", "|---|---|---|---|---|---|"]
    for info in method_options(method).specs():
        rows.append(f"| `{info.name}` | {_flag_cell(method, info)} | {_cell(info.default_words())} | "
                    f"{_cell(info.spec.check.accepts())} | {_cell(info.spec.help)} | {_cell(info.spec.paper or '')} |")
    return "\n".join(rows)


def compress_table() -> str:
    """``compress``'s method flags: the flag, the methods that take it, and its help (with defaults)."""
    rows = ["| flag | methods | what |", "|---|---|---|"]
    for flag in option_flags():
        methods = ", ".join(method for method, _ in flag.owners)
        rows.append(f"| `{flag.info.flag_name}` | {methods} | {_cell(flag.help(with_methods=False))} |")
    return "\n".join(rows)


def table(name: str) -> str:
    return compress_table() if name == "compress" else method_table(name)


def render(text: str) -> str:
    """``text`` (a docs page) with every marked table regenerated."""

    def replace(match: re.Match) -> str:
        name = match.group(1)
        return f"<!-- options: {name} -->\n{table(name)}\n<!-- /options: {name} -->"

    return re.sub(r"<!-- options: ([\w-]+) -->\n.*?<!-- /options: \1 -->", replace, text, flags=re.S)


def stale(docs: Path = DOCS) -> list[Path]:
    """The pages whose tables differ from the specs."""
    return [docs / page for page in sorted(set(PAGES.values()))
            if (docs / page).is_file() and render((docs / page).read_text()) != (docs / page).read_text()]


def main(argv: list[str]) -> int:
    pages = stale()
    if "--check" in argv:
        for page in pages:
            print(f"{page}: option tables out of date; run python -m distillery.cli.docs")
        return 1 if pages else 0
    for page in pages:
        page.write_text(render(page.read_text()))
        print(f"Rewrote the option tables of {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
