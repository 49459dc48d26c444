"""Text as Markdown for reports: user-named values escaped so they show as they are and build nothing
(:func:`md`), and numbers in the units every report table uses."""

from __future__ import annotations

import re
from typing import Any

# What turns plain text into Markdown or HTML: emphasis, code, links and images, table cells,
# strike-through, raw HTML and entities. An "_" between two letters or digits emphasises nothing
# and is left as it is (matthews_correlation stays readable in report.md).
_MARKUP = re.compile(r"[\\`*\[\]|~]|(?<![^\W_])_|_(?![^\W_])")
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# A line break would end the table row, list item or paragraph the text stands in.
_BREAKS = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


def md(value: Any, *, code: bool = False) -> str:
    """``value`` (anything user-named: a path, a run folder's name, a setting or a name read from a run's
    files) as Markdown that shows it as it is and builds nothing: no code span closed, no table cell
    added, no live HTML, no link. Every such value goes through here on its way into a report.

    ``code``: as a code span, whose content Markdown shows literally (HTML and backslashes included);
    it is fenced with more backticks than any run inside. Not for table cells, where GitHub's tables
    split at a "|" even inside a code span: there, plain (``code=False``) text."""
    text = _BREAKS.sub(" ", str(value))
    if code:
        ticks = "`" * (1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
        # one space each side is dropped when read, unless the span holds nothing but spaces
        pad = " " if text.strip() and (text[0] in "` " or text[-1] in "` ") else ""
        return f"{ticks}{pad}{text or ' '}{pad}{ticks}"
    text = _MARKUP.sub(lambda m: "\\" + m.group(0), text)
    return re.sub("[&<>]", lambda m: _ENTITIES[m.group(0)], text)



def fmt_metric(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.3f}" if abs(v) <= 1.5 else f"{v:.2f}"


def fmt_x(v: float | None, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}×"


def fmt_ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def fmt_rate(v: float | None) -> str:
    return "—" if v is None else f"{v:,.1f}"


def fmt_pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.1f} %"


def fmt_seconds(s: float) -> str:
    s = float(s)
    if s < 10:  # a 3 s run is not "0 s" (nor a 0.4 s one)
        return f"{s:.1f} s"
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"


def format_count(n: float | int | None) -> str:
    """22.7M, 1.5k, 812."""
    if n is None:
        return "—"
    n = float(n)
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= size:
            return f"{n / size:.1f}{suffix}"
    return f"{n:.0f}"
