"""On-policy distillation: a teacher scores each token the student sampled, and the student is pushed towards it.

The student samples a response, the teacher computes the log-probability of every sampled token, and each
token's advantage is the negative per-token reverse KL estimate (GKD: Agarwal et al., *On-Policy Distillation
of Language Models: Learning from Self-Generated Mistakes*, ICLR 2024, Sec. 3 with the reverse KL; Thinking
Machines, *On-Policy Distillation*, 2025, whose per-token reward is the same difference)::

    A_t = -(log pi_student(y_t | y_<t) - log pi_teacher(y_t | y_<t))      on sampled response tokens, 0 elsewhere

Its expectation over the student's samples is minus the reverse KL, KL(pi_student || pi_teacher), at each
visited state, so a policy-gradient step on it lowers the reverse KL on the student's own distribution. Each
token gets its own signal (no group normalisation, no critic), which is why distillation needs far fewer
samples than an outcome reward. ``algorithm=opd`` trains on it alone; ``algorithm.distill.coef`` adds
``coef * A_t`` to any estimator's advantage (GRPO plus distillation: slime's ``--opd-kl-coef``).
"""

from __future__ import annotations

import torch

from rlplat.algorithms.advantages import AdvantageInput, AdvantageOutput, estimator


def reverse_kl_advantage(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor,
                         response_mask: torch.Tensor) -> torch.Tensor:
    """``-(log pi_student - log pi_teacher)`` ``[batch, response_len]`` on the tokens of ``response_mask`` (the
    sampled ones: an agent loop's observation tokens are not in it), 0 elsewhere."""
    mask = response_mask.to(student_log_probs.dtype)
    return -(student_log_probs - teacher_log_probs.to(student_log_probs.dtype)) * mask


def distill_metrics(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor,
                    response_mask: torch.Tensor) -> dict[str, float]:
    """``distill/reverse_kl``: the mean over the batch's sampled tokens of log pi_student - log pi_teacher (an
    unbiased estimate of the per-token reverse KL on the student's samples; 0 when the student is the teacher);
    ``distill/teacher_log_prob``: the mean teacher log-probability of those tokens."""
    mask = response_mask.to(torch.float64)
    tokens = mask.sum().clamp(min=1)
    teacher = teacher_log_probs.double()
    gap = ((student_log_probs.double() - teacher) * mask).sum() / tokens
    return {"distill/reverse_kl": float(gap), "distill/teacher_log_prob": float((teacher * mask).sum() / tokens)}


@estimator("opd", distills=True)
def opd(inp: AdvantageInput) -> AdvantageOutput:
    """On-policy distillation alone (``algorithm=opd``): no advantage from the task reward, which is still
    computed and reported (``reward/*``) but not trained on; the advantage is the distillation term the
    ``advantages`` stage adds, ``algorithm.distill.coef`` x :func:`reverse_kl_advantage`."""
    zeros = torch.zeros_like(inp.token_level_rewards)
    return AdvantageOutput(advantages=zeros, returns=zeros)
