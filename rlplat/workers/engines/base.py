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
    def full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (name, full unsharded tensor) for every weight, in Hugging Face naming. Collective:
        every rank must iterate to the end."""

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


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting only attended tokens (left padding gets position 0), ``[B, L] -> [B, L]``.

    Matches how transformers' ``generate`` numbers left-padded prompts, so recomputed log-probs equal
    the rollout's.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def response_log_probs(
    logits: torch.Tensor, responses: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of ``responses`` under ``softmax(logits / temperature)``, and the scaled logits.

    ``logits``: ``[B, R, V]`` (the positions that predict each response token); ``responses``: ``[B, R]``.
    Computed in float32 at least, whatever the model's dtype.
    """
    scaled = logits.float() / temperature if temperature != 1.0 else logits.float()
    token_logits = scaled.gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    return token_logits - torch.logsumexp(scaled, dim=-1), scaled
