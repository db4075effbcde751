"""SIGINT/SIGTERM while training: finish the current step, save, shut down, exit non-zero.

The first signal only sets a flag that the training loop reads between steps, so a step (and a checkpoint
being written) is never cut in half. A second signal exits at once (``os._exit``): the checkpoint being
written, if any, is a ``.partial`` directory that resume ignores, so the previous one stays usable.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlplat.utils.errors import Interrupted


class StopRequest:
    def __init__(self):
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def interrupted(self, step: int, newest: Path | None) -> Interrupted:
        """The error ending a run stopped after ``step``: one line saying where it can be resumed from
        (``newest``: its newest checkpoint, None when nothing was saved)."""
        where = (f"the newest checkpoint is {newest}; run the same command again to resume (trainer.resume_mode="
                 f"auto), or python -m rlplat.tools.export {newest} for its model") if newest else "no checkpoint was saved"
        return Interrupted(f"stopped by {self.name} after step {step}; {where}", self.signum)

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:
            print(f"\nrlplat: second {signal.Signals(signum).name}: exiting now", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.signum = signum
        print(f"\nrlplat: {signal.Signals(signum).name} received: finishing the current step, then stopping "
              f"(send it again to exit at once)", file=sys.stderr, flush=True)


@contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Catch SIGINT and SIGTERM for the duration of the block (main thread only; elsewhere a no-op)."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.signal(s, stop._handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
