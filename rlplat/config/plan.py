"""The values that follow from a validated config, computed once by :func:`rlplat.config.validate.validate`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunPlan:
    """Values derived from a validated config (computed once, never stored back into it)."""

    device: str  # "cpu" | "cuda"
    world_size: int  # actor/rollout workers over all nodes
    mini_batches_per_step: int
    needs_critic: bool
    needs_ref: bool
    # where the PPO ratio's pi_old comes from: "update" (the update's own forward: it starts on the policy
    # that sampled) | "rollout" (the rollout engine's log-probs) | "recompute" (the old_log_probs stage)
    old_policy: str
    loss_scale_factor: float  # for seq-mean-token-sum-norm
    train_files: tuple[str, ...]
    val_files: tuple[str, ...]
