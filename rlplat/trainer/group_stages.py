"""The stages that keep or drop whole groups of responses (a prompt's ``rollout.n`` rows, one after another),
mixed into :class:`~rlplat.trainer.ppo.PPOTrainer`: DAPO's dynamic sampling (``filter_groups``: resample until
the batch holds enough groups whose scores differ) and ``drop_zero_gradient_groups`` (drop the groups whose
scores are all equal, without resampling: the batch shrinks)."""

from __future__ import annotations

import math

import torch

from rlplat.protocol import Batch
from rlplat.rollout.base import join_rollouts


def over_rounds(first: dict[str, float], later: list[dict[str, float]]) -> dict[str, float]:
    """The metrics the repeated stages of several generation rounds (dynamic sampling) report, over the rounds
    (``first``: the first round's, ``later``: the others'): timings and dropped groups add up, maxima are the
    largest, everything else is the mean of the rounds."""
    joined: dict[str, float] = {}
    for key in dict.fromkeys(key for round_metrics in later for key in round_metrics):
        values = ([first[key]] if key in first else []) + [r[key] for r in later if key in r]
        if key.startswith("timing/") or key == "rollout/dropped_groups":
            joined[key] = sum(values)
        else:
            joined[key] = max(values) if key.endswith("_max") else sum(values) / len(values)
    return joined


def varied_groups(batch: Batch, n: int) -> torch.Tensor:
    """Per row: whether the scores of its group (``n`` rows in a row) differ."""
    scores = batch.tensors["token_level_scores"].sum(-1).view(-1, n)
    return (scores.max(-1).values > scores.min(-1).values).repeat_interleave(n)


def zero_gradient_groups(batch: Batch, n: int, by_terms: bool) -> torch.Tensor:
    """Per row: whether its group gives no policy gradient under a group baseline: every response scored the
    same (``by_terms``: every reward term the same, for an estimator that normalises each term on its own)."""
    if by_terms and "reward_terms" in batch.tensors.keys():
        terms = batch.tensors["reward_terms"]
        grouped = terms.view(-1, n, terms.shape[-1])
        return (grouped.amax(1) == grouped.amin(1)).all(-1).repeat_interleave(n)
    return ~varied_groups(batch, n)


class GroupStages:
    """Stage methods of :class:`~rlplat.trainer.ppo.PPOTrainer` (which provides ``cfg``, ``plan``, ``components``,
    ``rollouts``, ``generate`` and ``reward``)."""

    def filter_groups(self, batch: Batch, metrics: dict) -> Batch:
        """DAPO dynamic sampling (2503.14476, Sec. 3.2): keep groups whose scores differ; run the
        ``generate`` and ``reward`` stages again (a recipe's overrides included) until
        ``data.train_batch_size_prompts`` groups are kept or ``max_gen_batches`` rounds ran.

        With a streamed rollout pool (``rollout.stream_groups``) each later round takes only the calls that hold
        the groups still missing. Metrics the repeated stages report are averaged over the rounds. When the
        rounds run out, the batch is topped up with dropped (all-equal) groups, each used once: a kept group is
        never repeated, so no uid ever names two groups.
        """
        n, want = self.cfg.rollout.n, self.cfg.data.train_batch_size_prompts
        kept, dropped, later = [], [], []  # the groups of each round; the metrics of the rounds after the first
        while True:
            varied = varied_groups(batch, n)
            if not kept:
                metrics["batch/real_batch_size_ratio"] = float(varied.float().mean())
            kept.append(batch[varied])
            dropped.append(batch[~varied])
            have = sum(len(b) for b in kept) // n
            if have >= want or len(kept) >= self.cfg.algorithm.dynamic_sampling.max_gen_batches:
                break
            later.append(extra := {})
            self.rollouts.next_groups(want - have)
            batch = self.reward(self.generate(None, extra), extra)
        metrics.update(over_rounds(metrics, later))
        metrics.update({"batch/gen_rounds": len(kept), "batch/filled_groups": max(0, want - have)})
        pieces = [b for b in kept + dropped if len(b) > 0]  # kept groups first, then the fill-up
        return join_rollouts(pieces, self.components.tokenizer.pad_token_id)[torch.arange(want * n)]

    def drop_zero_gradient_groups(self, batch: Batch, metrics: dict) -> Batch:
        """``algorithm.drop_zero_gradient_groups``: leave out the groups whose responses all scored the same (their
        advantages are zero under a group baseline, so they add no policy gradient) before the passes that
        follow, without resampling. The batch keeps whole mini-batches of every data-parallel replica: the
        number of groups kept is rounded up to a multiple that splits evenly, with some of the dropped groups
        (the first ones) where it must. Metrics: ``batch/zero_gradient_groups`` (found), ``batch/dropped_groups``
        and ``batch/kept_groups``."""
        n = self.cfg.rollout.n
        zero = zero_gradient_groups(batch, n, self.plan.estimator.uses_reward_terms).view(-1, n)[:, 0]
        groups = len(zero)
        trained = [group for group in (self.components.actor, self.components.critic) if group is not None]
        replicas = math.lcm(*(layout.dp_size for group in trained for layout in group.layouts()))
        rows_unit = replicas * self.plan.mini_batches_per_step  # rows must split into these equal parts
        unit = rows_unit // math.gcd(rows_unit, n)  # groups
        keep_count = min(groups, max(unit, math.ceil(int((~zero).sum()) / unit) * unit))
        order = torch.cat([torch.nonzero(~zero).flatten(), torch.nonzero(zero).flatten()])  # varied groups first
        kept = order[:keep_count].sort().values  # in their original order
        metrics.update({"batch/zero_gradient_groups": float(zero.sum()), "batch/kept_groups": float(keep_count),
                        "batch/dropped_groups": float(groups - keep_count)})
        rows = (kept[:, None] * n + torch.arange(n)).flatten()
        return batch[rows]
