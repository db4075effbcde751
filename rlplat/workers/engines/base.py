"""The training-engine interface: one model on one worker, sharded over the data-parallel group.

An engine turns a micro-batch into per-token log-probabilities (and entropy, or values for a critic),
back-propagates a loss, steps the optimizer and hands out its full weights (for the rollout engine and
for export). The loss itself is computed by the role that owns the engine (see
:mod:`rlplat.workers.actor_loss`), so engines know nothing about RL algorithms.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from rlplat.protocol import Batch
from rlplat.registry import Registry


@dataclass
class ForwardOutput:
    """Per-token outputs for the response part of a micro-batch, all ``[batch, response_len]``."""

    log_probs: torch.Tensor | None = None  # log π(response token) with logits / temperature
    entropy: torch.Tensor | None = None  # entropy of π(· | prefix) at each response position
    values: torch.Tensor | None = None  # critic value V(prefix before the token)
    logits: torch.Tensor | None = None  # [batch, response_len, vocab], only when asked (full KL)
    sum_pi_squared: torch.Tensor | None = None  # Σ_v π(v | prefix)² at each response position (optimal baselines)


class TrainingEngine(ABC):
    """Interface of the training backends (registry: ``TRAINING_ENGINES``, key ``actor.strategy``)."""

    @abstractmethod
    def forward(
        self,
        micro: Batch,
        *,
        temperature: float = 1.0,
        need_entropy: bool = False,
        need_logits: bool = False,
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
