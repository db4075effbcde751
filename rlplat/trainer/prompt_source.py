"""Where a run's prompts come from, and their numbering: ``data.dynamic_prompts_fn``'s picks first, then the
sampler's dataset order. Each prompt is a group (its ``rollout.n`` responses share its uid ``p<number>``);
the numbers count on across resumes, and the ledger (:mod:`rlplat.trainer.ledger`) records the groups trained
on. Both kinds of rollout sourcing (:mod:`rlplat.trainer.rollouts`) draw from one source."""

from __future__ import annotations

import numpy as np

from rlplat.protocol import Batch
from rlplat.trainer.ledger import PromptLedger


class PromptSource:
    def __init__(self, components, temperature: float):
        self.components, self.temperature = components, temperature
        self.seen = 0  # prompt groups numbered so far
        self.queued: list[int | dict] = []  # data.dynamic_prompts_fn's picks, served before the dataset's order
        self.ledger = PromptLedger()  # the prompt groups trained on

    def state(self) -> dict:
        """What a checkpoint keeps (``trainer.json``)."""
        return {"prompts_seen": self.seen, "queued_prompts": self.queued, "ledger": self.ledger.state()}

    def load_state(self, state: dict) -> None:
        self.seen = state["prompts_seen"]
        self.queued = state.get("queued_prompts") or []
        self.ledger = PromptLedger(state.get("ledger") or [])

    def draw(self, count: int) -> tuple[list[int | dict], list[int]]:
        """The next ``count`` prompts (dataset indices, or rows the hook queued) and their new group numbers."""
        entries, self.queued = self.queued[:count], self.queued[count:]
        if len(entries) < count:  # the hook's queue first, then the sampler
            entries += self.components.sampler.next_batch(count - len(entries))
        return entries, self.number(len(entries))

    def number(self, count: int) -> list[int]:
        """``count`` new group numbers."""
        self.seen += count
        return list(range(self.seen - count, self.seen))

    def batch(self, entries: list[int | dict], uids: list[int], step: int) -> Batch:
        """The prompt batch of ``entries``, each row tagged with its group's uid, for ``step``."""
        prompts = tag_groups(self.components.train_prompts(len(entries), entries), uids)
        prompts.meta.update(step=step, temperature=self.temperature)
        return prompts

    def queue(self, picks: list[int | dict]) -> None:
        """Serve ``picks`` (from ``data.dynamic_prompts_fn``) next, in order."""
        self.queued += picks


def tag_groups(prompts: Batch, numbers: list[int]) -> Batch:
    """``prompts`` with a uid per row (``p<number>``): the group of group estimators."""
    uids = np.array([f"p{i}" for i in numbers], dtype=object)
    return prompts.union(Batch.from_dict(non_tensors={"uid": uids}))
