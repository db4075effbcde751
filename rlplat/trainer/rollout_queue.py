"""Batches generated ahead on a separate rollout pool (``rollout.mode=separate``, ``trainer.async_steps=K``),
whole or streamed by prompt group (``rollout.stream_groups``).

While step s trains on the actor's workers, the rollout workers generate the batches of steps s+1 .. s+K.
The controller submits those generations and the weight syncs to the rollout workers, which run their calls
in the order submitted, so each call is sampled by the newest weights sent before it was submitted::

    step s:  take batch s  (submitting batch s+K first, after the weights of update s-1)
             reward, log-probs, advantages, update       | rollout pool: generates batches s+1 .. s+K
             send the weights of update s                 |   then loads them
    step s+1 ...

Each call's batch is scored in a thread of the queue as soon as its generation arrives, so an I/O-bound
reward also overlaps the training (unless a recipe overrides the trainer's ``reward`` stage). With
``rollout.partial=resume`` a rollout worker loads an update beside its calls, between two tokens of the one
under way (:class:`rlplat.workers.roles.RolloutWorker`); a call still never starts before the weights it
was submitted after (``weights_at_least``).

A call submitted after the weights of update v may be trained on at steps up to v + 1 + K, so no sample is
more than K updates old: ``off_policy/staleness_max`` (asserted, never exceeded). K = 0 generates each batch
with the weights of the update just before it, as a colocated run does.

Whole batches (``rollout.stream_groups=0``): each step's batch is one call split over the rollout workers, and
steps take them in order. Streaming (``rollout.stream_groups=N``): calls of N prompt groups, each to the
rollout worker with the fewest calls under way; a step takes the first ``data.train_batch_size_prompts``
groups scored, from whichever calls finished (the oldest weights first among those), so a call with a long
response holds up its own groups only. A call not taken by its last allowed step is dropped
(``rollout/dropped_groups``) and its prompts are generated again, first, by newer weights. Dynamic sampling
(DAPO) pulls only the calls it needs for the groups still missing (:attr:`RolloutQueue.next_take`).

A checkpoint records the prompts of the calls still in flight (dataset indices or queued rows, and their
uids); a resumed run generates them again, with the resumed weights, before drawing new prompts: no prompt
is trained on twice or skipped.

A rollout worker that dies (out of memory, a crash, a kill: Ray reports its calls failed) is replaced, up to
``rollout.max_restarts`` times in a run: a new worker starts in its place, loads the model and the actor's
current weights (checked: checksums and the log-prob probe), and the prompt groups of its calls in flight go
back to be generated first, by whichever workers the next calls go to. With ``rollout.weight_transport=
distributed`` the whole pool is replaced (its weight channel takes no new member) and every call in flight is
generated again. Past the limit the run stops with one line naming the checkpoint to resume from.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from rlplat.protocol import Batch
from rlplat.reward.batch import join_scores
from rlplat.rollout.base import join_rollouts
from rlplat.trainer.heartbeat import Heartbeat
from rlplat.trainer.prompt_source import PromptSource
from rlplat.trainer.rollouts import RolloutCalls, Rollouts, Started
from rlplat.utils.errors import ChannelBroken, NotPlaced, RunError, WorkerDied


@dataclass
class InFlight:
    """A generation call submitted to the rollout pool and not yet trained on."""

    entries: list  # its prompts as dataset indices, or rows queued by data.dynamic_prompts_fn
    uids: list[int]  # the uid number of each prompt group
    version: int  # the newest weights sent before it was submitted: those that generate it
    rank: int | None  # the rollout worker generating it (None: split over all of them)
    ready: Future | None = None  # -> (the generated batch, its scores or None, the scoring's wall-clock span)
    dropped: bool = False  # too old to train on: its prompts are generated again
    generated: bool = False  # its rollout worker is done with it

    def state(self) -> dict:
        return {"entries": self.entries, "uids": self.uids}


class RolloutQueue(Rollouts):
    """The generation calls in flight on the rollout pool, and the weights sent to it.

    ``components``: the run's (:class:`rlplat.trainer.components.Components`: the weight pushes and their
    checks, the pool's size, the tokenizer's pad id); ``score``: scores each call's batch as it arrives
    (None: the trainer's reward stage is a recipe's own and scores when the step runs it)."""

    def __init__(self, cfg, prompts: PromptSource, calls: RolloutCalls, components, timeline,
                 score: Callable[[Batch], Any] | None):
        self.prompts, self.calls, self.components, self.timeline, self.score = prompts, calls, components, timeline, score
        self.total_steps = cfg.trainer.total_steps
        self.step = 0  # the step taking its groups
        self.ahead = cfg.trainer.async_steps
        self.batch_groups = cfg.data.train_batch_size_prompts
        self.streams = cfg.rollout.stream_groups > 0
        self.call_groups = cfg.rollout.stream_groups or self.batch_groups
        self.in_flight: list[InFlight] = []  # oldest first
        self.ending: list[InFlight] = []  # dropped calls their rollout workers may still be generating
        # (entry, uid) of prompts to generate before new ones: in flight at the checkpoint a run resumed from,
        # or dropped as too old
        self.redo: list[tuple[Any, int]] = []
        self.next_take: int | None = None  # the groups the next take() returns (None: a batch's)
        self.max_restarts, self.restarts = cfg.rollout.max_restarts, 0
        self.node_wait_s = cfg.rollout.node_wait_s  # for a replacement to start (its node may have left the cluster)
        self.node_lost = cfg.rollout.node_lost  # then: stop, or continue with the workers left
        self._scoring = threading.Lock()
        self._pool = threading.Lock()  # held while workers are replaced, or asked for a heartbeat
        beat = cfg.rollout.heartbeat_s
        self.heartbeat = Heartbeat(components.generator, beat, self._pool) if beat > 0 else None
        # a thread per call in flight (the config keeps them few: rlplat.config.validate), and room for the calls
        # dynamic sampling pulls and the dropped ones still ending
        calls = (self.ahead + 3) * (self.batch_groups // self.call_groups)
        self.waiters = ThreadPoolExecutor(calls, thread_name_prefix="rlplat-rollout-queue")

    def start(self, step: int) -> None:
        """Send the actor's weights (version ``step``: the initial model, or the resumed checkpoint's) before
        anything is generated."""
        self.components.weights.send(step)
        if self.heartbeat is not None:
            self.heartbeat.start()

    def next_groups(self, count: int) -> None:
        if self.streams:  # pulled from the stream: the calls of the missing groups only
            self.next_take = count

    def take(self, step: int, metrics: dict) -> Batch:
        """This step's groups (``next_take`` of them, else a batch's), submitting the calls of the next K steps
        first, with their samples' staleness in ``metrics``."""
        self.step = step
        want, self.next_take = self.next_take or self.batch_groups, None
        calls = -(-want // self.call_groups)
        dropped = self._drop_expired()
        remaining = max(self.total_steps - step, 0)
        taken, parts = self._collect(calls, calls + self.batch_groups // self.call_groups * min(self.ahead, remaining))
        out = join_rollouts([part[0] for part in parts], self.components.tokenizer.pad_token_id)
        for key in ("weight_sync_s", "weight_sync_mb"):  # the pool's sync is the trainer's sync_rollout stage
            out.meta.pop(key, None)
        when = out.pop(["generated_from", "generated_until"]).tensors  # each rollout worker's call, for the timeline
        for start, end in sorted(set(zip(when["generated_from"].tolist(), when["generated_until"].tolist()))):
            self.timeline.add("rollout", "generate", start, end)
        if self.score is not None:
            for _, _, scoring in parts:
                self.timeline.add("controller", "reward (ahead)", *scoring)
            out.meta["scores"] = join_scores([part[1] for part in parts])  # the reward stage takes them
        staleness = (step - 1) - out.tensors["policy_version"]
        metrics["off_policy/staleness_mean"] = float(staleness.float().mean())
        metrics["off_policy/staleness_max"] = float(staleness.max())
        metrics["rollout/restarts"] = float(self.restarts)
        if self.streams:
            metrics["rollout/dropped_groups"] = float(dropped)
        if "policy_version_last" in out.tensors.keys():  # rollout.partial=resume
            spans = out.tensors["policy_version_last"] - out.tensors["policy_version"]
            metrics["rollout/resumed_frac"] = float((spans > 0).float().mean())  # samples spanning two weights or more
        if int(staleness.max()) > self.ahead or int(staleness.min()) < 0:
            raise RunError(f"step {step} got samples of policy versions {sorted(set(out.tensors['policy_version'].tolist()))} "
                           f"for weights of update {step - 1}: outside trainer.async_steps={self.ahead} (a bug in "
                           f"the rollout queue; please report it)")
        return out

    def _collect(self, calls: int, in_flight: int) -> tuple[list[InFlight], list[tuple]]:
        """The ``calls`` calls this step takes and what each gave (generated and scored, their weights checked),
        keeping ``in_flight`` calls submitted; a dead rollout worker's calls are generated again by others."""
        while True:
            self.fill(in_flight)
            taken = self._first_ready(calls) if self.streams else self.in_flight[:calls]
            try:
                parts = [flight.ready.result() for flight in taken]  # a reward error is raised here
                self.components.weights.check(self._weights_used(taken, [part[0] for part in parts]))
            except WorkerDied as death:
                self.outlive(death, self.step - 1)
                continue
            for flight in taken:
                self.in_flight.remove(flight)
            order = sorted(range(len(taken)), key=lambda i: taken[i].uids[0])
            return [taken[i] for i in order], [parts[i] for i in order]

    def sync(self, version: int) -> float:
        """Send the weights of update ``version`` to the rollout workers; when their weight channel lost one, the
        pool is replaced by workers holding them."""
        try:
            return self.components.weights.send(version)
        except ChannelBroken as broken:
            return self.outlive(WorkerDied(str(broken), self.components.generator.worker_cls.__name__), version)

    def outlive(self, death: WorkerDied, version: int) -> float:
        with self._pool:
            return self._replace(death, version)

    def _replace(self, death: WorkerDied, version: int) -> float:
        """A rollout worker died: replace it (or the pool: :meth:`WeightPush.replaceable`) with new workers holding
        the weights of update ``version``, and generate its calls' prompt groups again, first. Another worker's
        death, or one past ``rollout.max_restarts``, stops the run; so does a replacement that finds no room within
        ``rollout.node_wait_s`` (its node left), unless ``rollout.node_lost=continue``: the pool then goes on with
        the workers it still has."""
        generator = self.components.generator
        if death.worker != generator.worker_cls.__name__:
            raise death
        if self.heartbeat is not None and death.rank in self.heartbeat.hung:
            death = WorkerDied(f"{death.worker} rank {death.rank} of {generator.world_size} answered no heartbeat "
                               f"within rollout.heartbeat_s={self.heartbeat.seconds:g} s and was killed as hung",
                               death.worker, death.rank)
        if self.restarts >= self.max_restarts:
            raise WorkerDied(f"{death}; rollout.max_restarts={self.max_restarts} replacement(s) made already",
                             death.worker, death.rank)
        started = time.time()
        self.restarts += 1
        ranks = self.components.weights.replaceable(death.rank)
        lost = [flight for flight in self.in_flight if flight.rank is None or flight.rank in ranks]
        if self.heartbeat is not None:
            self.heartbeat.forget(ranks)
        self._requeue(lost)
        self.ending = [flight for flight in self.ending if flight.rank not in ranks]
        shrunk = ""
        try:
            generator.replace(ranks, self.node_wait_s)
        except NotPlaced as failed:  # their node left the cluster: the run stops, naming where it resumes, or goes on
            if self.node_lost == "stop" or len(failed.ranks) == generator.world_size:
                raise WorkerDied(f"{death}; {failed} (rollout.node_wait_s={self.node_wait_s:g})", death.worker,
                                 death.rank) from None
            ranks = self._go_on_without(failed.ranks, ranks)
            shrunk = (f"; {failed}: the pool goes on with the {generator.world_size} worker(s) left "
                      f"(rollout.node_lost=continue)")
        for pending in [generator.submit_to(rank, "init_model", self.components.model_path) for rank in ranks]:
            pending.result()
        sent_mb = 0.0
        if ranks:
            sent_mb = self.components.weights.replaced(ranks, version)
            shrunk += (f"; replaced rollout worker(s) {ranks} with new ones holding the weights of update {version} "
                       f"(checked)")
        print(f"[rollout] {death}{shrunk} in {time.time() - started:.1f}s; {sum(len(f.uids) for f in lost)} prompt "
              f"group(s) in flight are generated again (replacement {self.restarts} of rollout.max_restarts="
              f"{self.max_restarts})", flush=True)
        return sent_mb

    def _go_on_without(self, gone: list[int], replaced: list[int]) -> list[int]:
        """Shrink the rollout pool by the workers of ranks ``gone`` (their calls were put back already): the calls
        under way and the weight receipts of the others follow their new ranks. Returns ``replaced``'s new ranks."""
        def new_rank(rank: int) -> int:
            return rank - sum(lost < rank for lost in gone)
        for flight in self.in_flight + self.ending:
            if flight.rank is not None:
                flight.rank = new_rank(flight.rank)
        self.components.weights.removed(gone)
        self.components.generator.remove(gone)
        return [new_rank(rank) for rank in replaced if rank not in gone]

    def fill(self, count: int) -> None:
        """Submit calls until ``count`` are in flight: the prompts to generate again first, then new ones."""
        while len(self.in_flight) < count:
            again, self.redo = self.redo[:self.call_groups], self.redo[self.call_groups:]
            entries, uids = [entry for entry, _ in again], [uid for _, uid in again]
            if (fresh := self.call_groups - len(again)) > 0:
                new_entries, new_uids = self.prompts.draw(fresh)
                entries, uids = entries + new_entries, uids + new_uids
            ahead = sum(len(flight.uids) for flight in self.in_flight) // self.batch_groups
            prompts = self.prompts.batch(entries, uids, self.step + ahead)  # the step it is for (in error messages)
            flight = InFlight(entries, uids, self.step - 1, self._least_busy() if self.streams else None)
            prompts.meta["weights_at_least"] = flight.version  # rollout.partial=resume loads them beside the calls
            started = self.calls.start(prompts, flight.rank)
            flight.ready = self.waiters.submit(self._finish, flight, prompts, started)
            self.in_flight.append(flight)

    def _weights_used(self, taken: list[InFlight], batches: list[Batch]) -> dict[int, int]:
        """Each rollout worker's newest weights among the samples of ``taken``: the syncs to check before training."""
        used: dict[int, int] = {}
        for flight, batch in zip(taken, batches):
            versions = batch.tensors.get("policy_version_last", batch.tensors["policy_version"])
            ranks = range(self.components.generator.world_size) if flight.rank is None else [flight.rank]
            for rank in ranks:
                used[rank] = max(used.get(rank, -1), int(versions.max()))
        return used

    def _drop_expired(self) -> int:
        """Drop the calls this step may no longer train on (generated by weights more than K updates old); their
        prompts go back to be generated again. Returns the groups dropped."""
        oldest = self.step - 1 - self.ahead
        expired = [flight for flight in self.in_flight if flight.version < oldest]
        self._requeue(expired)
        self.ending = [flight for flight in self.ending + expired if not flight.generated]
        return sum(len(flight.uids) for flight in expired)

    def _requeue(self, flights: list[InFlight]) -> None:
        """Drop these calls (what they give is not trained on); their prompts are generated again, first."""
        for flight in flights:
            flight.dropped = True
            self.in_flight.remove(flight)
        self.redo = sorted(self.redo + [pair for flight in flights for pair in zip(flight.entries, flight.uids)],
                           key=lambda pair: pair[1])

    def _first_ready(self, calls: int) -> list[InFlight]:
        """The first ``calls`` calls to be generated and scored (the oldest weights first among those ready); a call
        whose rollout worker died, as soon as it is known (its worker is replaced while the others generate)."""
        while True:
            ready = [flight for flight in self.in_flight if flight.ready.done()]
            if died := [flight for flight in ready if isinstance(flight.ready.exception(), WorkerDied)]:
                return died[:1]
            if len(ready) >= calls:
                return sorted(ready, key=lambda f: (f.version, f.uids[0]))[:calls]
            wait([flight.ready for flight in self.in_flight if not flight.ready.done()], return_when=FIRST_COMPLETED)

    def _least_busy(self) -> int:
        """The rollout worker with the fewest calls under way, dropped ones included (the lowest rank among equals)."""
        busy = [0] * self.components.generator.world_size
        for flight in self.in_flight + self.ending:
            if not flight.generated:
                busy[flight.rank] += 1
        return min(range(len(busy)), key=lambda rank: (busy[rank], rank))

    def _finish(self, flight: InFlight, prompts: Batch, started: Started) -> tuple:
        """In a thread of the queue: wait for a call's generation, then score it (the reward overlaps the steps
        training meanwhile; an I/O-bound reward, a judge or a sandbox, waits off the step's path)."""
        started[0].result()  # the generation, waited for outside the lock
        flight.generated = True
        with self._scoring:
            out = self.calls.finish(prompts, started)
            if self.score is None or flight.dropped:
                return out, None, None
            start = time.time()
            scores = self.score(out)
            return out, scores, (start, time.time())

    def check_loaded_weights(self) -> None:
        try:
            self.components.weights.check()
        except WorkerDied as death:
            self.outlive(death, self.components.weights.version)

    def close(self) -> None:
        """Drop the calls not yet finished (the end of the run, or an error)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self.waiters.shutdown(wait=False, cancel_futures=True)

    def state(self) -> list[dict]:
        """What a checkpoint keeps of the calls in flight: their prompts, generated again on resume."""
        redo = [{"entries": [entry for entry, _ in self.redo], "uids": [uid for _, uid in self.redo]}] if self.redo else []
        return redo + [flight.state() for flight in self.in_flight]

    def restore(self, state: list[dict]) -> None:
        """The prompts a checkpoint had in flight (``uid_start``: a checkpoint of whole batches before streaming)."""
        self.redo = []
        for saved in state:
            uids = saved.get("uids") or list(range(saved["uid_start"], saved["uid_start"] + len(saved["entries"])))
            self.redo += zip(saved["entries"], uids)
