"""Token-sequence tensor helpers shared by the training engines and the rollout engines.

Both sides must number positions and score response tokens identically, or the rollout's log-probs
drift from the trainer's; keeping the helpers here (below both in the layer order) gives them one
definition and keeps ``rollout/`` and ``workers/`` from importing each other.
"""

from __future__ import annotations

import torch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting only attended tokens (left padding gets position 0), ``[B, L] -> [B, L]``.

    Matches how transformers' ``generate`` and vLLM number left-padded prompts, so recomputed log-probs
    equal the rollout's.
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


def response_mask_from_ids(responses: torch.Tensor, stop_ids: int | tuple[int, ...]) -> torch.Tensor:
    """1 on every token up to and including the first stop token (EOS, or any of ``stop_ids``; all tokens
    if there is none): ``[B, R]``."""
    is_eos = torch.isin(responses, torch.as_tensor(stop_ids, device=responses.device))
    eos_seen_before = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    return (~eos_seen_before).long()
