"""Rollout sourcing: where a step's generated groups come from (the trainer's ``generate`` stage asks
:meth:`Rollouts.take`).

- :class:`ColocatedRollouts` (``rollout.mode=colocated``): the actor's own workers generate the step's batch
  when it is asked for, with the weights of the update just before it.
- :class:`~rlplat.trainer.rollout_queue.RolloutQueue` (``rollout.mode=separate``): a pool of rollout workers
  generates batches ahead (``trainer.async_steps``), whole or streamed by prompt group.

Both draw their prompts from one :class:`~rlplat.trainer.prompt_source.PromptSource` and submit their
generations through :class:`RolloutCalls`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from rlplat.controller import Pending
from rlplat.data.vision import MULTI_MODAL
from rlplat.protocol import Batch
from rlplat.utils.errors import WorkerDied

Started = tuple[Pending, Pending | None]  # the sampled responses, and the greedy ones of a baseline (ReMax)


def model_inputs(batch: Batch) -> Batch:
    """What a model stage sends its workers: the tensors, meta and the rows' image inputs (a vision-language
    model's, which its forward reads). The text columns (prompts, ground truths, extra_info, uid) stay on the
    controller, which reads them (rewards, groups); pickling them for every call cost more than the tensors."""
    return batch.select(non_tensor_keys=[MULTI_MODAL] if MULTI_MODAL in batch.non_tensors else [])


class RolloutCalls:
    """Submits the generation of a prompt batch (``rollout.n`` responses each) to the generating workers and
    joins the answer with the prompts' columns.

    ``reads_rows``: whether the agent loop reads the rows' text columns (its environments do), or needs the
    tensors only (:attr:`rlplat.rollout.agent_loop.AgentLoop.reads_rows`). ``baseline_reward`` scores the
    greedy responses of an estimator that needs a baseline (ReMax): the trainer's ``reward`` stage."""

    def __init__(self, components, n: int, reads_rows: bool, baseline_reward: Callable[[Batch, dict], Batch] | None):
        self.components, self.n, self.reads_rows, self.baseline_reward = components, n, reads_rows, baseline_reward

    def start(self, prompts: Batch, rank: int | None = None) -> Started:
        """Submit ``prompts`` (split over the workers, or to worker ``rank`` alone), and one greedy response per
        prompt right after it (the same weights) when a baseline is needed."""
        repeated = prompts.repeat(self.n, interleave=True)
        sampled = self._submit(repeated if self.reads_rows else model_inputs(repeated), rank)
        greedy = None
        if self.baseline_reward is not None:
            meta = {**prompts.meta, "temperature": 0.0}
            greedy = self._submit(Batch.from_dict(dict(prompts.tensors), prompts.non_tensors, meta), rank)
        return sampled, greedy

    def _submit(self, batch: Batch, rank: int | None) -> Pending:
        generator = self.components.generator  # the actor's workers, or the rollout pool's
        if rank is None:
            return generator.submit("generate_sequences", batch)
        return generator.submit_to(rank, "generate_sequences", batch)

    def finish(self, prompts: Batch, started: Started) -> Batch:
        """The responses :meth:`start` submitted, with the prompts' columns (and the baseline scores)."""
        sampled, greedy = started
        out = sampled.result()
        if not self.reads_rows:  # the columns the workers were not sent (image inputs came back with the rows)
            columns = [key for key in prompts.non_tensors if key not in out.non_tensors]
            out = out.union(prompts.repeat(self.n, interleave=True).select(tensor_keys=[], non_tensor_keys=columns))
        if greedy is not None:  # ReMax: the greedy response's score
            scored = self.baseline_reward(greedy.result(), {})
            baseline = scored.tensors["token_level_scores"].sum(-1).repeat_interleave(self.n)
            out = out.union(Batch.from_dict({"baseline_scores": baseline}))
        out.meta.update(prompts.meta, temperature=out.meta["temperature"])
        return out


class Rollouts(ABC):
    """A step's generated groups. ``pool``: where the ``generate`` stage's time goes in the timeline."""

    pool = "controller"

    def start(self, step: int) -> None:
        """Before the first step (``step``: 0, or the resumed one)."""

    @abstractmethod
    def take(self, step: int, metrics: dict) -> Batch:
        """The groups of ``step`` (generated, joined with their prompts' columns), with the rollout's metrics."""

    def sync(self, version: int) -> float:
        """After the update numbered ``version``: send its weights to where the generations happen, when that is
        a pool of its own. Returns the MiB each rollout worker receives (0: nothing to send; colocated engines
        load the actor's weights as their generation starts)."""
        return 0.0

    def next_groups(self, count: int) -> None:
        """The next :meth:`take` needs only ``count`` groups (dynamic sampling's missing ones); a source that
        hands out whole batches ignores it."""

    def close(self) -> None:
        """The end of the run, or an error: drop what is not finished."""

    def check_loaded_weights(self) -> None:
        """After a validation (every engine has loaded the weights sent before it): were the syncs exact?"""

    def outlive(self, death: WorkerDied, version: int) -> float:
        """A worker died (in a call of :meth:`take`, :meth:`sync` or a validation): replace it, holding the weights
        of update ``version``, or go on without it, when the rollout pool can (returns the MiB sent to the new
        workers); else the run stops (``death`` is raised)."""
        raise death

    def state(self) -> list[dict]:
        """What a checkpoint keeps of generations not trained on yet (generated again on resume)."""
        return []

    def restore(self, state: list[dict]) -> None:
        """The generations a checkpoint had in flight."""


class ColocatedRollouts(Rollouts):
    """The actor's workers generate each step's batch when it is asked for (their rollout engine shares the
    device with the actor and loads the updated weights as the generation starts)."""

    pool = "trainer"

    def __init__(self, prompts, calls: RolloutCalls, batch_groups: int):
        self.prompts, self.calls, self.batch_groups = prompts, calls, batch_groups

    def take(self, step: int, metrics: dict) -> Batch:
        prompts = self.prompts.batch(*self.prompts.draw(self.batch_groups), step)
        out = self.calls.finish(prompts, self.calls.start(prompts))
        metrics["timing/weight_sync_s"] = out.meta.pop("weight_sync_s", 0.0)
        metrics["perf/weight_sync_mb"] = out.meta.pop("weight_sync_mb", 0.0)  # into each engine (0: shared, or no change)
        return out
