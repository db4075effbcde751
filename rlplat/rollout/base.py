"""The rollout-engine interface: prompts in, sampled responses (with their log-probs) out.

Input Batch fields: ``prompts`` ``[B, P]`` (left-padded ids) and ``prompt_mask`` ``[B, P]``. Output adds
``responses`` ``[B, R]`` (right-padded with the pad id), ``response_mask`` ``[B, R]`` (1 up to and
including the EOS token), ``rollout_log_probs`` ``[B, R]`` (log-softmax of logits / temperature),
and the concatenated ``input_ids``, ``attention_mask`` and ``position_ids`` ``[B, P + R]`` that the
training engines consume. ``R`` is always ``max_new_tokens``, so batches from several calls concatenate.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from rlplat.protocol import Batch
from rlplat.registry import Registry
from rlplat.workers.engines.base import position_ids_from_mask


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off


class RolloutEngine(ABC):
    """Interface of the generation backends (registry: ``ROLLOUT_ENGINES``, key ``rollout.name``)."""

    @abstractmethod
    def generate(self, batch: Batch, params: SamplingParams) -> Batch:
        """Sample one response per row of ``batch`` (repeat rows first for n > 1)."""

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights with the given (Hugging Face name, full tensor) pairs."""

    def sleep(self) -> None:
        """Free generation-only memory (KV cache) while training runs; no-op where not supported."""

    def wake_up(self) -> None:
        """Undo :meth:`sleep` before the next generation."""


ROLLOUT_ENGINES: Registry[type[RolloutEngine]] = Registry("rollout engine")


def response_mask_from_ids(responses: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """1 on every token up to and including the first EOS (all tokens if there is none): ``[B, R]``."""
    is_eos = responses == eos_token_id
    eos_seen_before = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    return (~eos_seen_before).long()


def assemble_rollout(
    prompts: Batch, responses: torch.Tensor, response_mask: torch.Tensor, rollout_log_probs: torch.Tensor
) -> Batch:
    """Join prompts and responses into the Batch layout documented in this module."""
    prompt_ids, prompt_mask = prompts.tensors["prompts"], prompts.tensors["prompt_mask"]
    attention_mask = torch.cat([prompt_mask.long(), response_mask.long()], dim=1)
    generated = Batch.from_dict(
        tensors={
            "responses": responses,
            "response_mask": response_mask.long(),
            "rollout_log_probs": rollout_log_probs * response_mask,
            "input_ids": torch.cat([prompt_ids, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask),
        }
    )
    return prompts.union(generated)
