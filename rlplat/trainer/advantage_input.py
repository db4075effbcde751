"""What the ``advantages`` stage hands the advantage estimator: the batch's fields as one
:class:`~rlplat.algorithms.AdvantageInput` (groups from the uids, the reward terms for gdpo, the rollout
correction's weights for the optimal token baselines, the ``algorithm`` options)."""

from __future__ import annotations

import numpy as np
import torch
from omegaconf import DictConfig

from rlplat.algorithms import AdvantageInput, AdvantageOptions
from rlplat.protocol import Batch
from rlplat.workers.actor_loss import rollout_correction


def advantage_input(batch: Batch, rewards: torch.Tensor, algo: DictConfig,
                    term_weights: torch.Tensor | None) -> AdvantageInput:
    """``rewards`` ``[batch, response_len]`` (the token-level scores, with a KL penalty when it is in the
    reward) and the batch's optional fields; ``term_weights`` ``[num_terms]`` are the reward stage's."""
    t = batch.tensors
    _, group_ids = np.unique(batch.non_tensors["uid"].astype(str), return_inverse=True)
    present = set(t.keys())

    def optional(key: str) -> torch.Tensor | None:
        return t[key] if key in present else None

    terms, weights = reward_terms(batch, term_weights)
    return AdvantageInput(
        token_level_rewards=rewards,
        response_mask=t["response_mask"],
        group_ids=torch.as_tensor(group_ids, dtype=torch.long),
        values=optional("values"),
        baseline_scores=optional("baseline_scores"),
        reward_components=terms,
        reward_weights=weights,
        old_log_probs=optional("old_log_probs"),
        sum_pi_squared=optional("sum_pi_squared"),
        importance_weights=importance_weights(batch, algo.off_policy),
        options=AdvantageOptions(gamma=algo.gamma, lam=algo.lam, epsilon=algo.norm_adv_epsilon,
                                 scale=algo.norm_adv_scale, gpg_f_norm=algo.gpg_f_norm,
                                 otb_zero_tail=algo.otb_zero_tail),
    )


def importance_weights(batch: Batch, off_policy) -> torch.Tensor | None:
    """The off-policy correction's weights ``[batch, response_len]`` exactly as the loss takes them
    (``algorithm.off_policy``; None when it is ``none``)."""
    t = batch.tensors
    if off_policy.correction == "none" or "rollout_log_probs" not in t.keys():
        return None
    return rollout_correction(t["old_log_probs"], t, t["response_mask"], off_policy)[0]


def reward_terms(batch: Batch, term_weights: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The reward terms ``[batch, num_terms]`` and weights ``[num_terms]`` for gdpo.

    Whatever a recipe's reward stage added to the scores beyond the reward functions (e.g. a length
    penalty) becomes one more term of weight 1, so the terms always add up to the scores.
    """
    t = batch.tensors
    if "reward_terms" not in t.keys() or term_weights is None:
        return None, None
    terms, weights = t["reward_terms"], term_weights.to(t["reward_terms"].dtype)
    residual = t["token_level_scores"].sum(-1).to(terms.dtype) - terms @ weights  # [batch]
    if bool((residual.abs() > 1e-5).any()):
        terms = torch.cat([terms, residual.unsqueeze(-1)], dim=-1)
        weights = torch.cat([weights, weights.new_ones(1)])
    return terms, weights
