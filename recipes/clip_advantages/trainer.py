"""The recipe's trainer: one inserted stage (``clip_advantages``); the rest is rlplat's loop.

Clipping advantages bounds the update any single response can cause (a guard used e.g. when rewards
have rare large outliers); with GRPO's group-normalised advantages, c = 1 clips the responses that are
more than one group standard deviation from their group's mean.
"""

from __future__ import annotations

import os

from rlplat.protocol import Batch
from rlplat.trainer.ppo import PPOTrainer


class ClipAdvantagesTrainer(PPOTrainer):
    stage_order = PPOTrainer.insert_stage("clip_advantages", after="advantages")
    # The recipe's one knob, read from the environment so the entry point stays rlplat's CLI.
    max_abs = float(os.environ.get("CLIP_ADVANTAGES_MAX_ABS", "1.0"))

    def clip_advantages(self, batch: Batch, metrics: dict) -> Batch:
        adv = batch.pop(["advantages"]).tensors["advantages"]  # [batch, response_len]
        mask = batch.tensors["response_mask"].bool()
        clipped = adv.clamp(-self.max_abs, self.max_abs)
        metrics["recipe/adv_clip_frac"] = float((clipped != adv)[mask].float().mean()) if mask.any() else 0.0
        return batch.union(Batch.from_dict({"advantages": clipped}))
