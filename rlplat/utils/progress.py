"""Live progress of a run (``trainer.progress``): where it is, how long is left, how it is doing.

* ``rich``: on a terminal, a bar over the training steps with the ETA, the current stage and the key
  metrics (reward, validation accuracy, response length, step time, tokens/s), and a second bar while a
  validation generates. Everything else printed meanwhile (step lines, worker output) scrolls above it.
* ``plain``: for logs and files, one line at most every ``PLAIN_EVERY_S`` seconds (and at the last step)
  with the step, the share done, the ETA and the same metrics; no control characters.
* ``off``: nothing. ``auto`` (the default) is ``rich`` on a terminal and ``plain`` otherwise.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

MODES = ("auto", "rich", "plain", "off")
PLAIN_EVERY_S = 30.0
SHOWN = (("score/mean", "reward"), ("val/accuracy", "val acc"), ("response_length/mean", "resp len"),
         ("off_policy/staleness_max", "stale"), ("timing/step_s", "s/step"), ("perf/tokens_per_s", "tok/s"))


def resolve_mode(mode: str, stream=None) -> str:
    """``auto`` -> ``rich`` when ``stream`` (stdout) is a terminal, else ``plain``."""
    if mode not in MODES:
        raise ValueError(f"trainer.progress={mode!r} is not one of: {', '.join(MODES)}")
    if mode != "auto":
        return mode
    stream = stream or sys.stdout
    return "rich" if hasattr(stream, "isatty") and stream.isatty() else "plain"


def _eta(seconds: float) -> str:
    return str(timedelta(seconds=int(seconds)))


class Progress:
    """Context manager around the training loop; call :meth:`stage`, :meth:`step_done` and
    :meth:`validating` as the run goes."""

    def __init__(self, mode: str, total_steps: int, start_step: int = 0):
        self.mode, self.total, self.start = resolve_mode(mode), total_steps, start_step
        self.values: dict[str, str] = {}  # label -> latest value shown
        self._bar = self._task = self._val_task = None
        self._began = self._last_plain = time.monotonic()

    def __enter__(self) -> Progress:
        if self.mode == "rich":
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[values]}"),
                transient=False, redirect_stdout=True, redirect_stderr=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("train", total=self.total, completed=self.start, values="")
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def stage(self, name: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=f"train · {name:<13}")

    def step_done(self, step: int, metrics: dict[str, float]) -> None:
        for key, label in SHOWN:
            if key in metrics:
                value = metrics[key]
                self.values[label] = f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"
        shown = "  ".join(f"{label} {value}" for label, value in self.values.items())
        if self._bar is not None:
            self._bar.update(self._task, completed=step, description="train", values=shown)
        elif self.mode == "plain":
            now = time.monotonic()
            if now - self._last_plain >= PLAIN_EVERY_S or step == self.total:
                self._last_plain = now
                done = step - self.start
                eta = (now - self._began) / done * (self.total - step) if done else 0.0
                print(f"[progress] step {step}/{self.total} ({100 * step / self.total:.0f}%) eta {_eta(eta)}  {shown}",
                      flush=True)

    def validating(self, done: int, total: int) -> None:
        """``done`` of ``total`` validation batches generated (a bar of its own, removed when complete)."""
        if self._bar is None:
            return
        if self._val_task is None:
            self._val_task = self._bar.add_task("validate", total=total, values="")
        self._bar.update(self._val_task, completed=done)
        if done >= total:
            self._bar.remove_task(self._val_task)
            self._val_task = None
