"""The recipe's trainer: one inserted stage (``clip_advantages``); the rest is rlplat's loop.

Clipping advantages bounds the update any single response can cause (a guard used e.g. when rewards
have rare large outliers); with GRPO's group-normalised advantages, c = 1 clips the responses that are
more than one group standard deviation from their group's mean. c is ``recipe.max_abs`` (default 1.0):
``python -m recipes.clip_advantages.main recipe.max_abs=2``.
"""

from __future__ import annotations

from rlplat.protocol import Batch
from rlplat.trainer.ppo import PPOTrainer


class ClipAdvantagesTrainer(PPOTrainer):
    stage_order = PPOTrainer.insert_stage("clip_advantages", after="advantages")

    @property
    def max_abs(self) -> float:
        """The recipe's one setting, from the config's free-form ``recipe`` section."""
        return float(self.cfg.recipe.get("max_abs", 1.0))

    def clip_advantages(self, batch: Batch, metrics: dict) -> Batch:
        adv = batch.pop(["advantages"]).tensors["advantages"]  # [batch, response_len]
        mask = batch.tensors["response_mask"].bool()
        clipped = adv.clamp(-self.max_abs, self.max_abs)
        metrics["recipe/adv_clip_frac"] = float((clipped != adv)[mask].float().mean()) if mask.any() else 0.0
        return batch.union(Batch.from_dict({"advantages": clipped}))
