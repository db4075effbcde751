"""rlplat's RL math: advantage estimators, policy losses, loss aggregation and KL, each behind a registry.

Pure torch (no Ray, no torch.distributed, no I/O). Each plug-in kind has one registry and one typed
call signature, so the trainer never branches on a name:

=====================  ==========================  =========================================
kind                   registry                    call
=====================  ==========================  =========================================
advantage estimator    ``ADVANTAGE_ESTIMATORS``    ``fn(AdvantageInput) -> AdvantageOutput``
policy loss            ``POLICY_LOSSES``           ``fn(PolicyLossInput) -> PolicyLossOutput``
loss aggregation mode  ``AGGREGATION_MODES``       ``fn(loss, mask, LossDenominators, scale)``
KL estimator           ``KL_ESTIMATORS``           ``fn(KLInput) -> [batch, response_len]``
KL controller          ``KL_CONTROLLERS``          ``cls.from_options(coef, target, horizon)``
off-policy correction  ``OFF_POLICY_CORRECTIONS``  ``fn(OffPolicyInput) -> Correction``
=====================  ==========================  =========================================

Adding an estimator from your own module (imported before the trainer builds its config, e.g. from a
recipe) is one decorated function; it is then selectable as ``algorithm.adv_estimator=my_baseline``::

    import torch
    from rlplat.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInput, AdvantageOutput
    from rlplat.algorithms.masked import sequence_scores

    @ADVANTAGE_ESTIMATORS.register("my_baseline")
    def my_baseline(inp: AdvantageInput) -> AdvantageOutput:
        scores = sequence_scores(inp.token_level_rewards, inp.response_mask)   # [batch]
        adv = (scores - scores.mean())[:, None] * inp.response_mask            # [batch, response_len]
        return AdvantageOutput(advantages=adv, returns=adv)

A name that is already registered is refused unless ``register("name", replace=True)``; an unknown
name fails with the list of known names and a did-you-mean.
"""

from rlplat.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInput,
    AdvantageOptions,
    AdvantageOutput,
    EstimatorSpec,
    compute_advantages,
    estimator_spec,
    get_advantage_estimator,
)
from rlplat.algorithms.aggregation import AGGREGATION_MODES, LossDenominators, aggregate_loss, get_aggregation
from rlplat.algorithms.kl import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    KLInput,
    get_kl_estimator,
    kl_estimator_names,
    kl_penalized_rewards,
    kl_penalty,
    make_kl_controller,
)
from rlplat.algorithms.off_policy import OFF_POLICY_CORRECTIONS, Correction, OffPolicyInput
from rlplat.algorithms.policy_losses import (
    POLICY_LOSSES,
    PolicyLossConfig,
    PolicyLossInput,
    PolicyLossOptions,
    PolicyLossOutput,
    entropy_from_logits,
    get_policy_loss,
    policy_loss_config,
    value_loss,
)
from rlplat.algorithms import divergence_losses, token_baselines  # noqa: F401  (register their plug-ins)
from rlplat.algorithms.distillation import distill_metrics, reverse_kl_advantage
from rlplat.algorithms.reward_shaping import OverlongShaping
from rlplat.algorithms.reweight import PF_PPO_METHODS, pf_ppo_resample, pf_ppo_weights

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AGGREGATION_MODES", "KL_CONTROLLERS", "KL_ESTIMATORS", "OFF_POLICY_CORRECTIONS",
    "PF_PPO_METHODS", "POLICY_LOSSES",
    "AdaptiveKLController", "AdvantageInput", "AdvantageOptions", "AdvantageOutput", "Correction", "EstimatorSpec",
    "FixedKLController", "KLController", "KLInput", "LossDenominators", "OffPolicyInput", "OverlongShaping",
    "PolicyLossConfig",
    "PolicyLossInput", "PolicyLossOptions", "PolicyLossOutput",
    "aggregate_loss", "compute_advantages", "distill_metrics", "entropy_from_logits", "estimator_spec",
    "get_advantage_estimator",
    "get_aggregation", "get_kl_estimator", "get_policy_loss", "kl_estimator_names", "kl_penalized_rewards",
    "kl_penalty", "make_kl_controller", "pf_ppo_resample", "pf_ppo_weights", "policy_loss_config",
    "reverse_kl_advantage", "value_loss",
]
