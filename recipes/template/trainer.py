"""The recipe's trainer: one overridden stage (``reward``), everything else is rlplat's loop."""

from __future__ import annotations

import torch

from rlplat.protocol import Batch
from rlplat.trainer.ppo import PPOTrainer


def length_penalty(token_level_scores: torch.Tensor, response_mask: torch.Tensor, per_token: float) -> torch.Tensor:
    """Subtract ``per_token`` x (response length) from each response's score, on its last token.

    ``[B, R]`` scores with the score on the last valid token (as the reward stage places it) -> same.
    """
    mask = response_mask.bool()
    lengths = mask.sum(-1).to(token_level_scores.dtype)
    last = (mask.long() * torch.arange(mask.shape[1])).argmax(-1)
    out = token_level_scores.clone()
    rows = torch.arange(len(out))[lengths > 0]
    out[rows, last[rows]] -= per_token * lengths[rows]
    return out


class LengthPenaltyTrainer(PPOTrainer):
    penalty_per_token = 0.01  # edit (or subclass) to change the recipe's one knob

    def reward(self, batch: Batch, metrics: dict) -> Batch:
        batch = super().reward(batch, metrics)
        scores = batch.pop(["token_level_scores"]).tensors["token_level_scores"]
        shaped = length_penalty(scores, batch.tensors["response_mask"], self.penalty_per_token)
        metrics["recipe/length_penalty_mean"] = float((scores - shaped).sum(-1).mean())
        return batch.union(Batch.from_dict({"token_level_scores": shaped}))
