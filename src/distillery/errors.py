"""The one exception type a user is meant to read.

Anything raised as ``DistilleryError`` is a plain sentence about the user's input (a file, a line,
a field, an option). The CLI prints it on one line and exits non-zero without a traceback; any
other exception is a bug and keeps its traceback.
"""


class DistilleryError(Exception):
    """A problem with the user's input or environment, stated as a plain sentence."""
