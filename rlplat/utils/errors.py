"""Errors that end a run with one line.

:class:`RunError` is a failure found while running (not in the config or the data files) whose message says
everything a user needs: the entry point prints ``rlplat: <message>`` and exits with ``exit_code`` (1),
without a traceback (``RLPLAT_DEBUG=1`` shows it). :class:`WorkerDied` is a worker process that died.
:class:`Interrupted` is a run stopped by SIGINT/SIGTERM (exit status 128 + the signal number, as a shell reports
it). :func:`debug_traceback` prints the traceback behind such a line when ``RLPLAT_DEBUG=1``.
"""

import os
import traceback


class RunError(RuntimeError):
    """A run-time failure with a complete, one-line message."""

    exit_code = 1


class WorkerDied(RunError):
    """A worker process died (out of memory, a crash, a kill): what it held is lost, so the run stops, unless its
    group can replace it (a separate rollout pool: ``rollout.max_restarts``). ``worker``: the worker's class name,
    ``rank``: its rank in its group (None when not known)."""

    def __init__(self, message: str, worker: str | None = None, rank: int | None = None):
        super().__init__(message)
        self.worker, self.rank = worker, rank

    def resumable(self, newest) -> "WorkerDied":
        """The same error, saying where the run resumes from: the newest complete checkpoint (a path; None when
        none was saved). The step under way is lost whole: a checkpoint is only ever of a finished step."""
        where = (f"the step under way is lost; rerun the same command to resume from {newest} "
                 f"(trainer.resume_mode=auto)" if newest else "no checkpoint was saved yet (trainer.save_freq)")
        return WorkerDied(f"{self}; {where}", self.worker, self.rank)


class NotPlaced(RunError):
    """New workers that Ray found no room for within the time they were given (the node of their places left the
    cluster): ``ranks``, in their group."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


class ChannelBroken(RunError):
    """A weight broadcast that did not reach every receiver of its channel (one of them died): the channel is of no
    further use; the receivers' pool is replaced (``rollout.max_restarts``) or the run stops."""


class Interrupted(RunError):
    """The run stopped on a signal after finishing (and, if configured, saving) the current step."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


def debug_traceback() -> None:
    """With RLPLAT_DEBUG=1 the traceback behind a one-line error is printed too."""
    if os.environ.get("RLPLAT_DEBUG", "") not in ("", "0"):
        traceback.print_exc()
