"""The one exception type a user is meant to read.

Anything raised as ``DistilleryError`` is a plain sentence about the user's input (a file, a line,
a field, an option). The CLI prints it on one line and exits non-zero without a traceback; any
other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
from pathlib import Path


class DistilleryError(Exception):
    """A problem with the user's input or environment, stated as a plain sentence."""


def listed(items, limit: int = 10) -> str:
    """``items`` joined by commas for a sentence, at most the first ``limit`` of them and then how many more: a
    file's 500 labels or columns, named in full, would bury the sentence they belong to."""
    items = [str(item) for item in items]
    more = len(items) - limit
    return ", ".join(items[:limit]) + (f", … and {more:,} more" if more > 0 else "")


def json_object(path: str | Path, what: str) -> dict:
    """The JSON object in ``path``, or one sentence naming ``what`` the file is (``"The model config"``), the
    file, and what is wrong with it: unreadable, not JSON, or JSON of another kind than an object."""
    path = Path(path)
    try:
        content = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        cause = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DistilleryError(f"Cannot read {what[0].lower()}{what[1:]} {path}: {cause}") from None
    if not isinstance(content, dict):
        raise DistilleryError(f"{what} {path} holds a JSON {type(content).__name__}, not an object.")
    return content
