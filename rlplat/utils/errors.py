"""Errors that end a run with one line.

:class:`RunError` is a failure found while running (not in the config or the data files) whose message says
everything a user needs: the entry point prints ``rlplat: <message>`` and exits with status 1, without a
traceback (``RLPLAT_DEBUG=1`` shows it).
"""


class RunError(RuntimeError):
    """A run-time failure with a complete, one-line message."""
