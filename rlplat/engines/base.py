"""The training-engine interface: one model on one worker, sharded over the data-parallel group.

An engine turns a micro-batch into per-token log-probabilities (and entropy, or values for a critic),
back-propagates a loss, steps the optimizer and hands out its full weights (for the rollout engine and
for export). The loss itself is computed by the role that owns the engine (see
:mod:`rlplat.workers.actor_loss`), so engines know nothing about RL algorithms.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from rlplat.config.errors import ConfigError
from rlplat.protocol import Batch
from rlplat.registry import Registry

LR_SCHEDULES = ("constant", "linear", "cosine")  # {actor,critic}.optim.lr_schedule, after the warmup


def lr_lambda(schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float):
    """LR multiplier per optimizer step: linear warmup to 1 over ``warmup_steps`` (the first step
    already gets 1/warmup, never 0), then constant, linear or cosine decay to ``min_lr_ratio``."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown LR schedule {schedule!r}; known: {', '.join(LR_SCHEDULES)}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        decay = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return min_lr_ratio + (1.0 - min_lr_ratio) * decay

    return factor


@dataclass
class ForwardOutput:
    """Per-token outputs for the response part of a micro-batch, all ``[batch, response_len]``."""

    log_probs: torch.Tensor | None = None  # log π(response token) with logits / temperature
    entropy: torch.Tensor | None = None  # entropy of π(· | prefix) at each response position
    values: torch.Tensor | None = None  # critic value V(prefix before the token)
    sum_pi_squared: torch.Tensor | None = None  # Σ_v π(v | prefix)² at each response position (optimal baselines)


class TrainingEngine(ABC):
    """Interface of the training backends (registry: ``TRAINING_ENGINES``, key ``actor.strategy``)."""

    @classmethod
    def check_config(cls, cfg: DictConfig, device: str) -> None:
        """Raise ConfigError, naming the key, for a value of the sections this engine reads (its own
        ``actor.<strategy>`` section, ``actor.optim``, ``critic.optim``) that it cannot run on ``device``."""
        for section in ("actor", "critic"):
            schedule = cfg[section].optim.lr_schedule
            if schedule not in LR_SCHEDULES:
                raise ConfigError(f"{section}.optim.lr_schedule={schedule!r} is not one of: {', '.join(LR_SCHEDULES)}")

    @abstractmethod
    def forward(
        self,
        micro: Batch,
        *,
        temperature: float = 1.0,
        need_entropy: bool = False,
        need_sum_pi_squared: bool = False,
        grad: bool = False,
    ) -> ForwardOutput:
        """Run the model on ``micro`` (fields ``input_ids``, ``attention_mask``, ``position_ids``,
        ``responses``) and return the response-part outputs. ``grad=False`` runs under no_grad."""

    @abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate gradients of ``loss`` (already scaled with the global denominators)."""

    @abstractmethod
    def optimizer_step(self) -> dict[str, float]:
        """Clip, step, zero grads, advance the LR schedule; return ``grad_norm`` and ``lr``."""

    @abstractmethod
    def export_weights(
        self, dtype: torch.dtype | None = None, bucket_bytes: int = 512 * 2**20
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Yield the full (unsharded) weights in Hugging Face naming, cast to ``dtype`` (None = as
        trained), in buckets of about ``bucket_bytes``: one collective per bucket, and no rank ever holds
        more than one bucket of full weights. Collective: every rank must iterate to the end."""

    def full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every (name, full tensor), as trained (for export and checks). Collective."""
        for bucket in self.export_weights():
            yield from bucket

    @abstractmethod
    def save_checkpoint(self, path: str) -> None:
        """Write the sharded training state (weights, optimizer, LR schedule, RNG) under ``path``.
        Collective: every rank calls it with the same path."""

    @abstractmethod
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (same world size). Collective."""

    @property
    @abstractmethod
    def model(self) -> torch.nn.Module: ...


TRAINING_ENGINES: Registry[type[TrainingEngine]] = Registry("training engine")
