"""Errors that end a run with one line.

:class:`RunError` is a failure found while running (not in the config or the data files) whose message says
everything a user needs: the entry point prints ``rlplat: <message>`` and exits with ``exit_code`` (1),
without a traceback (``RLPLAT_DEBUG=1`` shows it). :class:`Interrupted` is a run stopped by SIGINT/SIGTERM
(exit status 128 + the signal number, as a shell reports it). :func:`debug_traceback` prints the traceback
behind such a line when ``RLPLAT_DEBUG=1``.
"""

import os
import traceback


class RunError(RuntimeError):
    """A run-time failure with a complete, one-line message."""

    exit_code = 1


class Interrupted(RunError):
    """The run stopped on a signal after finishing (and, if configured, saving) the current step."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


def debug_traceback() -> None:
    """With RLPLAT_DEBUG=1 the traceback behind a one-line error is printed too."""
    if os.environ.get("RLPLAT_DEBUG", "") not in ("", "0"):
        traceback.print_exc()
