"""Start-up validation of the composed config, before anything starts.

Names of plug-ins are checked against their registries (never against a hand-written list), counts
against the schema's ``count`` marks, cross-field rules (batch divisibility, group estimators need
``rollout.n >= 2``, ...) here, and rules the runtime also needs through the one definition both import
(e.g. the overlong buffer's bound is :class:`~rlplat.algorithms.OverlongShaping`'s). The engines check
their own sections (``actor.fsdp``, ``rollout.<name>``): :mod:`rlplat.workers.engine_setup`. The
values that follow from the config (world size, sequences per step, whether a critic is needed, ...)
are computed into a separate :class:`RunPlan`: the config itself is never changed after this point.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlplat.algorithms import OverlongShaping, policy_loss_config
from rlplat.algorithms.advantages import SCALES as ADV_SCALES
from rlplat.config.errors import ConfigError
from rlplat.config.plan import RunPlan
from rlplat.config.schema import count_keys
from rlplat.registry import Registry
from rlplat.utils.progress import MODES as PROGRESS_MODES
from rlplat.utils.tracking import LOGGERS

if TYPE_CHECKING:
    import torch

#: micro-batch token budgets: None (count sequences) or a number of tokens
TOKEN_BUDGETS = ("actor.micro_batch_max_tokens_per_worker", "critic.micro_batch_max_tokens_per_worker",
                 "ref.log_prob_micro_batch_max_tokens_per_worker")

ENUMS: dict[str, tuple[str, ...]] = {
    "rollout.dtype": ("auto", "float32", "bfloat16", "float16"),
    "rollout.mode": ("colocated", "server"),
    "data.truncation": ("error", "left", "right", "filter"),
    "algorithm.norm_adv_scale": ADV_SCALES,
    "ref.placement": ("colocated", "separate"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "reward.isolation": ("process", "inprocess"),
    "trainer.nonfinite": ("stop", "skip"),
    "algorithm.truncated_responses": ("keep", "mask", "penalize"),
    "trainer.progress": PROGRESS_MODES,
}


def _get(cfg: DictConfig, key: str):
    return OmegaConf.select(cfg, key, throw_on_missing=True)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _check_name(cfg: DictConfig, key: str, registry: Registry, names: Iterable[str] | None = None) -> None:
    value = _get(cfg, key)
    known = tuple(names) if names is not None else registry.names()
    if value not in known:
        raise ConfigError(f"{key}={value!r} is not registered; {registry.suggestion(value, known)}")


def _registries() -> list[tuple[str, Registry, Callable[[], Iterable[str]] | None]]:
    # Imported here: the registries fill up as their modules import, and plug-ins a user registers
    # before calling load_config() must count.
    from rlplat.algorithms import (
        ADVANTAGE_ESTIMATORS, AGGREGATION_MODES, KL_CONTROLLERS, KL_ESTIMATORS, POLICY_LOSSES,
        kl_estimator_names,
    )

    return [
        ("algorithm.adv_estimator", ADVANTAGE_ESTIMATORS, None),
        ("algorithm.policy_loss", POLICY_LOSSES, None),
        ("algorithm.loss_agg_mode", AGGREGATION_MODES, None),
        ("algorithm.kl_penalty", KL_ESTIMATORS, kl_estimator_names),
        ("algorithm.kl_loss_type", KL_ESTIMATORS, kl_estimator_names),
        ("algorithm.kl_ctrl.type", KL_CONTROLLERS, None),
    ]


def _as_paths(cfg: DictConfig, key: str) -> tuple[str, ...]:
    value = _get(cfg, key)
    paths = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, ListConfig) else None
    _check(
        paths is not None and len(paths) > 0 and all(isinstance(p, str) and p for p in paths),
        f"{key} must be a path or a non-empty list of paths, got {value!r}",
    )
    return paths


def _check_values(cfg: DictConfig) -> None:
    for key in count_keys():
        _check(_get(cfg, key) >= 1, f"{key} must be >= 1, got {_get(cfg, key)}")
    for key in TOKEN_BUDGETS:
        value = _get(cfg, key)
        _check(value is None or value >= 1, f"{key} must be >= 1 (tokens) or null, got {value}")
    for key, allowed in ENUMS.items():
        value = _get(cfg, key)
        _check(value in allowed, f"{key}={value!r} is not one of: {', '.join(allowed)}")
    for name in _get(cfg, "trainer.logger"):
        _check(name in LOGGERS, f"trainer.logger entry {name!r} is not one of: {', '.join(LOGGERS)}")
    algo, rollout = cfg.algorithm, cfg.rollout
    _check(0 <= algo.gamma <= 1 and 0 <= algo.lam <= 1, "algorithm.gamma and algorithm.lam must be in [0, 1]")
    _check(rollout.temperature > 0, f"rollout.temperature must be > 0 for training, got {rollout.temperature}")
    _check(rollout.val_temperature >= 0, "rollout.val_temperature must be >= 0 (0 = greedy)")
    _check(0 < rollout.top_p <= 1, f"rollout.top_p must be in (0, 1], got {rollout.top_p}")
    _check(rollout.top_k == -1 or rollout.top_k > 0, f"rollout.top_k must be -1 or > 0, got {rollout.top_k}")
    _check(algo.tis_cap is None or algo.tis_cap > 0, f"algorithm.tis_cap must be > 0 (or null = off), got {algo.tis_cap}")
    for section in ("actor", "critic"):
        optim = cfg[section].optim
        _check(optim.lr > 0, f"{section}.optim.lr must be > 0, got {optim.lr}")
        _check(len(optim.betas) == 2, f"{section}.optim.betas must be two numbers, got {list(optim.betas)}")
    reward = cfg.reward
    _check(reward.timeout_s > 0, f"reward.timeout_s must be > 0 seconds, got {reward.timeout_s}")
    _check(reward.fail_fraction_to_stop > 0,
           f"reward.fail_fraction_to_stop must be > 0 (1 = stop when all calls fail), got {reward.fail_fraction_to_stop}")
    problem = reward_weights_problem(reward.functions, reward.weights)
    _check(problem is None, problem or "")
    for name in reward.only_when_correct:
        _check(name in reward.functions, f"reward.only_when_correct entry {name!r} is not in reward.functions "
                                         f"{list(reward.functions)}")
    ref = cfg.ref
    _check(ref.sync_steps >= 0, f"ref.sync_steps must be >= 0 (0 = a fixed reference), got {ref.sync_steps}")
    _check(0 < ref.sync_alpha <= 1, f"ref.sync_alpha must be in (0, 1] (1 = copy the actor), got {ref.sync_alpha}")
    hook = cfg.data.dynamic_prompts_fn
    _check(hook is None or (":" in hook and all(hook.rsplit(":", 1))),
           f"data.dynamic_prompts_fn={hook!r}: expected 'pkg.module:function' or 'path/to/file.py:function'")


def reward_weights_problem(functions, weights) -> str | None:
    """``reward.weights`` gives one weight per entry of ``reward.functions`` (also checked by the reward
    manager when it is built from a config that skipped validation)."""
    if len(functions) != len(weights):
        return f"reward.weights has {len(weights)} entries but reward.functions has {len(functions)}"
    return None


def _check_batches(cfg: DictConfig, world: int) -> int:
    data, actor, n = cfg.data, cfg.actor, cfg.rollout.n
    step, mini = data.train_batch_size_prompts, actor.mini_batch_size_prompts
    _check(
        step % mini == 0,
        f"actor.mini_batch_size_prompts={mini} must divide data.train_batch_size_prompts={step}",
    )
    mini_seqs = mini * n
    _check(
        mini_seqs % world == 0,
        f"actor.mini_batch_size_prompts x rollout.n = {mini_seqs} sequences must divide evenly over "
        f"{world} workers (trainer.nnodes x trainer.workers_per_node)",
    )
    per_worker = mini_seqs // world
    for key in ("actor.micro_batch_size_seqs_per_worker", "critic.micro_batch_size_seqs_per_worker"):
        micro = _get(cfg, key)
        _check(
            per_worker % micro == 0,
            f"{key}={micro} must divide the {per_worker} sequences each worker holds per mini-batch "
            f"(actor.mini_batch_size_prompts x rollout.n / workers)",
        )
    return step // mini


def _check_algorithm(cfg: DictConfig) -> None:
    from rlplat.algorithms import PF_PPO_METHODS, AdvantageOptions, get_advantage_estimator

    algo = cfg.algorithm
    estimator = get_advantage_estimator(algo.adv_estimator)
    _check(
        not (getattr(estimator, "uses_reward_terms", False) and algo.use_kl_in_reward),
        f"algorithm.adv_estimator={algo.adv_estimator!r} normalises each reward function's term on its own, "
        "so a KL in the reward would be lost; use algorithm.use_kl_loss=true for a KL term instead",
    )
    _check_policy_loss_options(cfg)
    try:
        AdvantageOptions(gpg_f_norm=algo.gpg_f_norm)
    except ValueError as err:
        raise ConfigError(f"algorithm.{err}") from None
    pf_ppo = algo.pf_ppo
    _check(pf_ppo.reweight_method in PF_PPO_METHODS,
           f"algorithm.pf_ppo.reweight_method={pf_ppo.reweight_method!r} is not one of: {', '.join(PF_PPO_METHODS)}")
    _check(pf_ppo.weight_pow >= 0, f"algorithm.pf_ppo.weight_pow must be >= 0, got {pf_ppo.weight_pow}")
    min_group = getattr(estimator, "min_group_size", 1)
    _check(
        cfg.rollout.n >= min_group,
        f"algorithm.adv_estimator={algo.adv_estimator!r} compares responses to the same prompt and needs "
        f"rollout.n >= {min_group}, got rollout.n={cfg.rollout.n}",
    )
    if algo.dynamic_sampling.enable:
        _check(
            min_group >= 2,
            "algorithm.dynamic_sampling.enable=true filters groups by score variance and needs a group "
            f"estimator; algorithm.adv_estimator={algo.adv_estimator!r} is not one",
        )
    if algo.overlong_buffer.enable:
        overlong = algo.overlong_buffer
        try:
            OverlongShaping(cfg.data.max_response_length, overlong.length, overlong.penalty_factor)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    if algo.loss_scale_factor is not None:
        _check(algo.loss_scale_factor > 0, f"algorithm.loss_scale_factor must be > 0, got {algo.loss_scale_factor}")


def _check_policy_loss_options(cfg: DictConfig) -> None:
    """The losses' own checks (PolicyLossConfig), reported against the config keys."""
    try:
        policy_loss_config(cfg.algorithm)
    except ValueError as err:
        section = "algorithm" if str(err).startswith("clip_ratio") else "algorithm.policy_loss_options"
        raise ConfigError(f"{section}.{err}") from None


OLD_LOG_PROBS = ("auto", "recompute", "rollout")


def old_policy(cfg: DictConfig, device: str, mini_batches: int) -> str:
    """Where the PPO ratio's π_old comes from (:attr:`RunPlan.old_policy`).

    "update": one epoch over one mini-batch starts from the policy that sampled, so the update's own
    forward gives π_old exactly; unless a KL in the reward or the estimator (``needs_sum_pi_squared``)
    reads the actor's log-probs before the update. "rollout": the rollout engine's log-probs, which skips
    the actor's log-prob pass over the batch (verl's rollout-correction bypass mode). The PPO ratio is
    then taken against the policy that actually sampled. ``auto`` picks it only where those log-probs are
    the actor's own to float error: the hf engine samples with the actor's weights, and both sides compute
    in float32 (0.5e-6 mean |Δ log π| on the Quickstart; docs/concepts.md). "recompute": the actor's pass.
    """
    from rlplat.algorithms import get_advantage_estimator

    algo = cfg.algorithm
    _check(algo.old_log_probs in OLD_LOG_PROBS,
           f"algorithm.old_log_probs={algo.old_log_probs!r} is not one of: {', '.join(OLD_LOG_PROBS)}")
    reads_sum_sq = getattr(get_advantage_estimator(algo.adv_estimator), "needs_sum_pi_squared", False)
    if cfg.actor.ppo_epochs == 1 and mini_batches == 1 and not algo.use_kl_in_reward and not reads_sum_sq:
        return "update"
    if algo.old_log_probs == "rollout":
        _check(algo.tis_cap is None, "algorithm.tis_cap weights tokens by pi_old / pi_rollout, which is 1 with "
                                     "algorithm.old_log_probs=rollout; set algorithm.old_log_probs=recompute")
        _check(not reads_sum_sq, f"algorithm.adv_estimator={algo.adv_estimator!r} reads sum_pi_squared from the "
                                 f"actor's log-prob pass; set algorithm.old_log_probs=recompute")
        return "rollout"
    if algo.old_log_probs == "recompute" or algo.tis_cap is not None or algo.use_kl_in_reward or reads_sum_sq:
        return "recompute"
    import torch

    mixed = (cfg.actor.get(cfg.actor.strategy) or {}).get("mixed_precision", "auto")
    float32 = resolve_rollout_dtype(cfg, torch.device(device)) == torch.float32 and not computes_in_bf16(mixed, device)
    return "rollout" if cfg.rollout.name == "hf" and float32 else "recompute"


def computes_in_bf16(mixed_precision: str, device: str) -> bool:
    """``<role>.<engine>.mixed_precision`` on ``device`` ("cuda" | "cpu"): auto and bf16 compute in bfloat16
    (weights, gradients and optimizer stay float32) on a GPU; on CPU everything computes in float32."""
    return device == "cuda" and mixed_precision in ("auto", "bf16")


def resolve_rollout_dtype(cfg: DictConfig, device: torch.device) -> torch.dtype:
    """``rollout.dtype`` on ``device`` (a torch.device): auto = bfloat16 on a GPU, float32 on CPU."""
    import torch

    if cfg.rollout.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, cfg.rollout.dtype)


def resolve_device(cfg: DictConfig) -> str:
    """``trainer.device`` with ``auto`` resolved to cuda when a GPU is visible, else cpu."""
    import torch

    device = cfg.trainer.device
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    _check(device != "cuda" or torch.cuda.is_available(), "trainer.device=cuda but no CUDA device is visible")
    return device


def _check_placement(cfg: DictConfig, world: int) -> None:
    if cfg.trainer.ray_address == "inprocess":
        _check(world == 1, f"trainer.ray_address=inprocess runs one worker; got {world} (nnodes x workers_per_node)")
        _check(cfg.ref.placement == "colocated", "ref.placement=separate needs Ray (trainer.ray_address=inprocess)")


def validate(cfg: DictConfig) -> RunPlan:
    """Check ``cfg`` and return the derived :class:`RunPlan`; raise ConfigError on the first problem."""
    from rlplat.algorithms import get_advantage_estimator

    for key, registry, names in _registries():
        _check_name(cfg, key, registry, names() if names else None)
    _check_values(cfg)
    train_files, val_files = _as_paths(cfg, "data.train_files"), _as_paths(cfg, "data.val_files")
    world = cfg.trainer.nnodes * cfg.trainer.workers_per_node
    _check_algorithm(cfg)
    mini_batches = _check_batches(cfg, world)
    device = resolve_device(cfg)
    _check_placement(cfg, world)
    algo = cfg.algorithm
    needs_kl = algo.use_kl_in_reward or algo.use_kl_loss
    needs_ref = needs_kl if cfg.ref.enable is None else bool(cfg.ref.enable)
    _check(not (needs_kl and not needs_ref), "a KL term is enabled (algorithm.use_kl_*) but ref.enable=false")
    _check(not cfg.ref.sync_steps or needs_ref, f"ref.sync_steps={cfg.ref.sync_steps} syncs a reference policy, but "
                                                f"this run has none (no KL term; set ref.enable=true to keep one)")
    return RunPlan(
        device=device,
        world_size=world,
        mini_batches_per_step=mini_batches,
        # the estimator declares it: a registered estimator that needs values gets a critic, whatever its name
        needs_critic=bool(getattr(get_advantage_estimator(algo.adv_estimator), "needs_values", False)),
        needs_ref=needs_ref,
        old_policy=old_policy(cfg, device, mini_batches),
        loss_scale_factor=float(algo.loss_scale_factor or cfg.data.max_response_length),
        train_files=train_files,
        val_files=val_files,
    )
