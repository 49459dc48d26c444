"""The one exception type a user is meant to read.

Anything raised as ``DistilleryError`` is a plain sentence about the user's input (a file, a line,
a field, an option). The CLI prints it on one line and exits non-zero without a traceback; any
other exception is a bug and keeps its traceback.
"""


class DistilleryError(Exception):
    """A problem with the user's input or environment, stated as a plain sentence."""


def listed(items, limit: int = 10) -> str:
    """``items`` joined by commas for a sentence, at most the first ``limit`` of them and then how many more: a
    file's 500 labels or columns, named in full, would bury the sentence they belong to."""
    items = [str(item) for item in items]
    more = len(items) - limit
    return ", ".join(items[:limit]) + (f", … and {more:,} more" if more > 0 else "")
