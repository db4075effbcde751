"""Batches generated ahead on a separate rollout pool (``rollout.mode=separate``, ``trainer.async_steps=K``).

While step s trains on the actor's workers, the rollout workers generate the batches of steps s+1 .. s+K.
The controller submits those generations and the weight syncs to the rollout workers, which run their calls
in the order submitted, so each batch is sampled by the newest weights sent before it was submitted::

    step s:  take batch s  (submitting batch s+K first, after the weights of update s-1)
             reward, log-probs, advantages, update       | rollout pool: generates batches s+1 .. s+K
             send the weights of update s                 |   then loads them
    step s+1 ...

Each batch is scored in the queue's thread as soon as its generation arrives, so an I/O-bound reward also
overlaps the training (unless a recipe overrides the trainer's ``reward`` stage).

The batch of step t is submitted after the weights of update t-1-K were sent, so every sample is at most K
updates old: ``off_policy/staleness_max`` (asserted, never exceeded). K = 0 generates each batch with
the weights of the update just before it, as a colocated run does.

A checkpoint records the prompts of the batches still in flight (dataset indices or queued rows, and their
uids); a resumed run generates them again, with the resumed weights, before drawing new prompts: no prompt
is trained on twice or skipped.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from rlplat.controller import Pending
from rlplat.protocol import Batch
from rlplat.utils.errors import RunError


class Trainer(Protocol):
    """What the queue uses of its trainer (:class:`rlplat.trainer.ppo.PPOTrainer`)."""

    cfg: Any
    components: Any
    timeline: Any
    step: int
    prompts_seen: int

    def next_prompt_entries(self, num_prompts: int) -> list: ...
    def next_prompts(self, entries: list, uid_start: int | None = None) -> Batch: ...
    def start_rollout(self, prompts: Batch) -> tuple[Pending, Pending | None]: ...
    def finish_rollout(self, prompts: Batch, started: tuple[Pending, Pending | None]) -> Batch: ...


@dataclass
class InFlight:
    """A batch submitted to the rollout pool and not yet trained on."""

    entries: list  # its prompts as dataset indices, or rows queued by data.dynamic_prompts_fn
    uid_start: int  # the uid number of its first prompt group
    ready: Future  # -> (the generated batch, its scores or None, the scoring's wall-clock span)

    def state(self) -> dict:
        return {"entries": self.entries, "uid_start": self.uid_start}


class RolloutQueue:
    """The batches in flight on the rollout pool, oldest first, and the weights sent to it."""

    def __init__(self, trainer: Trainer, score_ahead: bool):
        self.trainer = trainer
        self.ahead = trainer.cfg.trainer.async_steps
        self.in_flight: deque[InFlight] = deque()
        self.redo: list[dict] = []  # batches in flight at the checkpoint a run resumed from (their state())
        # each generated batch is scored as soon as it arrives, in this thread (in order), unless the trainer's
        # reward stage is a recipe's own (it then scores when the step runs it)
        self.score_ahead = score_ahead
        self.finisher = ThreadPoolExecutor(1, thread_name_prefix="rlplat-rollout-queue")

    def start(self, step: int) -> None:
        """Send the actor's weights (version ``step``: the initial model, or the resumed checkpoint's) before
        anything is generated."""
        self.trainer.components.push_weights(step)

    def take(self, metrics: dict) -> Batch:
        """The oldest batch in flight (submitting the batches of the next K steps first), with its samples'
        staleness in ``metrics``."""
        trainer = self.trainer
        self.fill(1 + min(self.ahead, max(trainer.cfg.trainer.total_steps - trainer.step, 0)))
        flight = self.in_flight.popleft()
        out, scores, scoring = flight.ready.result()  # a reward error is raised here, in the step that needs it
        trainer.components.check_weight_syncs()
        spans = out.pop(["generated_from", "generated_until"]).tensors  # each rollout worker's call, for the timeline
        for start, end in sorted(set(zip(spans["generated_from"].tolist(), spans["generated_until"].tolist()))):
            trainer.timeline.add("rollout", "generate", start, end)
        if scores is not None:
            trainer.timeline.add("controller", "reward (ahead)", *scoring)
            out.meta["scores"] = scores  # the reward stage takes them
        staleness = (trainer.step - 1) - out.tensors["policy_version"]
        metrics["off_policy/staleness_mean"] = float(staleness.float().mean())
        metrics["off_policy/staleness_max"] = float(staleness.max())
        if int(staleness.max()) > self.ahead or int(staleness.min()) < 0:
            raise RunError(f"step {trainer.step} got samples of policy versions {sorted(set(out.tensors['policy_version'].tolist()))} "
                           f"for weights of update {trainer.step - 1}: outside trainer.async_steps={self.ahead} (a bug in "
                           f"the rollout queue; please report it)")
        return out

    def fill(self, count: int) -> None:
        """Submit batches until ``count`` are in flight: first those of the checkpoint resumed from."""
        trainer = self.trainer
        while len(self.in_flight) < count:
            if self.redo:
                state = self.redo.pop(0)
                entries, uid_start = state["entries"], state["uid_start"]
            else:
                entries, uid_start = trainer.next_prompt_entries(trainer.cfg.data.train_batch_size_prompts), None
            start = trainer.prompts_seen if uid_start is None else uid_start
            prompts = trainer.next_prompts(entries, uid_start)
            prompts.meta["step"] = trainer.step + len(self.in_flight)  # the step it is for (in error messages)
            started = trainer.start_rollout(prompts)
            self.in_flight.append(InFlight(entries, start, self.finisher.submit(self._finish, prompts, started)))

    def _finish(self, prompts: Batch, started: tuple[Pending, Pending | None]) -> tuple:
        """In the queue's thread: wait for a batch's generation, then score it (the reward overlaps the steps
        training meanwhile; an I/O-bound reward, a judge or a sandbox, waits off the step's path)."""
        out = self.trainer.finish_rollout(prompts, started)
        if not self.score_ahead:
            return out, None, None
        start = time.time()
        scores = self.trainer.components.score_batch(out)
        return out, scores, (start, time.time())

    def close(self) -> None:
        """Drop the batches not yet finished (the end of the run, or an error)."""
        self.finisher.shutdown(wait=False, cancel_futures=True)

    def state(self) -> list[dict]:
        """What a checkpoint keeps of the batches in flight: their prompts, generated again on resume."""
        return self.redo + [flight.state() for flight in self.in_flight]

    def restore(self, state: list[dict]) -> None:
        self.redo = list(state)
