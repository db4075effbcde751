"""Start-up validation: every check of the composed config in one place, before anything starts.

Names of plug-ins are checked against their registries (never against a hand-written list), cross-field
rules (batch divisibility, group estimators need ``rollout.n >= 2``, ...) are checked here, and the
values that follow from the config (world size, sequences per step, whether a critic is needed, ...)
are computed into a separate :class:`RunPlan`: the config itself is never changed after this point.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlplat.config.loader import ConfigError
from rlplat.registry import Registry

ENUMS: dict[str, tuple[str, ...]] = {
    "model.dtype": ("auto", "float32", "bfloat16", "float16"),
    "data.truncation": ("error", "left", "right", "filter"),
    "actor.optim.lr_schedule": ("constant", "linear", "cosine"),
    "critic.optim.lr_schedule": ("constant", "linear", "cosine"),
    "actor.fsdp.mixed_precision": ("auto", "none", "bf16"),
    "algorithm.norm_adv_scale": ("group", "batch", "none"),
    "ref.placement": ("colocated", "separate"),
    "trainer.device": ("auto", "cpu", "cuda"),
}
LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
POSITIVE_INTS = (
    "data.train_batch_size_prompts", "data.val_batch_size_prompts", "data.max_prompt_length",
    "data.max_response_length", "actor.mini_batch_size_prompts", "actor.micro_batch_size_seqs_per_worker",
    "actor.log_prob_micro_batch_size_seqs_per_worker", "actor.ppo_epochs", "rollout.n", "rollout.val_n",
    "rollout.generate_batch_size_seqs_per_worker", "ref.log_prob_micro_batch_size_seqs_per_worker",
    "critic.micro_batch_size_seqs_per_worker", "critic.ppo_epochs", "trainer.total_steps", "trainer.nnodes",
    "trainer.workers_per_node", "ref.workers_per_node",
)


@dataclass(frozen=True)
class RunPlan:
    """Values derived from a validated config (computed once, never stored back into it)."""

    device: str  # "cpu" | "cuda"
    world_size: int  # actor/rollout workers over all nodes
    seqs_per_step: int  # data.train_batch_size_prompts x rollout.n
    mini_batches_per_step: int
    seqs_per_mini_batch_per_worker: int
    needs_critic: bool
    needs_ref: bool
    loss_scale_factor: float  # for seq-mean-token-sum-norm
    train_files: tuple[str, ...]
    val_files: tuple[str, ...]


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
    ] + _engine_registries()


def _engine_registries() -> list[tuple[str, Registry, None]]:
    from rlplat.rollout import ROLLOUT_ENGINES
    from rlplat.workers.engines import TRAINING_ENGINES

    return [("actor.strategy", TRAINING_ENGINES, None), ("rollout.name", ROLLOUT_ENGINES, None)]


def _as_paths(cfg: DictConfig, key: str) -> tuple[str, ...]:
    value = _get(cfg, key)
    paths = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, ListConfig) else None
    _check(
        paths is not None and len(paths) > 0 and all(isinstance(p, str) and p for p in paths),
        f"{key} must be a path or a non-empty list of paths, got {value!r}",
    )
    return paths


def _check_values(cfg: DictConfig) -> None:
    for key in POSITIVE_INTS:
        _check(_get(cfg, key) >= 1, f"{key} must be >= 1, got {_get(cfg, key)}")
    for key, allowed in ENUMS.items():
        value = _get(cfg, key)
        _check(value in allowed, f"{key}={value!r} is not one of: {', '.join(allowed)}")
    for name in _get(cfg, "trainer.logger"):
        _check(name in LOGGERS, f"trainer.logger entry {name!r} is not one of: {', '.join(LOGGERS)}")
    algo, rollout = cfg.algorithm, cfg.rollout
    _check(algo.clip_ratio_c > 1.0, f"algorithm.clip_ratio_c must be > 1 (dual clip), got {algo.clip_ratio_c}")
    _check(algo.clip_ratio_low >= 0 and algo.clip_ratio_high >= 0, "algorithm.clip_ratio_low/high must be >= 0")
    _check(0 <= algo.gamma <= 1 and 0 <= algo.lam <= 1, "algorithm.gamma and algorithm.lam must be in [0, 1]")
    _check(rollout.temperature > 0, f"rollout.temperature must be > 0 for training, got {rollout.temperature}")
    _check(rollout.val_temperature >= 0, "rollout.val_temperature must be >= 0 (0 = greedy)")
    _check(0 < rollout.top_p <= 1, f"rollout.top_p must be in (0, 1], got {rollout.top_p}")
    _check(rollout.top_k == -1 or rollout.top_k > 0, f"rollout.top_k must be -1 or > 0, got {rollout.top_k}")
    for section in ("actor", "critic"):
        optim = cfg[section].optim
        _check(optim.lr > 0, f"{section}.optim.lr must be > 0, got {optim.lr}")
        _check(len(optim.betas) == 2, f"{section}.optim.betas must be two numbers, got {list(optim.betas)}")
    reward = cfg.reward
    _check(
        len(reward.functions) == len(reward.weights),
        f"reward.weights has {len(reward.weights)} entries but reward.functions has {len(reward.functions)}",
    )


def _check_batches(cfg: DictConfig, world: int) -> tuple[int, int]:
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
    return step // mini, per_worker


def _check_algorithm(cfg: DictConfig) -> None:
    from rlplat.algorithms import get_advantage_estimator

    algo = cfg.algorithm
    estimator = get_advantage_estimator(algo.adv_estimator)
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
        _check(
            0 < algo.overlong_buffer.length < cfg.data.max_response_length,
            f"algorithm.overlong_buffer.length={algo.overlong_buffer.length} must be in "
            f"(0, data.max_response_length={cfg.data.max_response_length})",
        )
    for key in ("algorithm.kl_penalty", "algorithm.kl_loss_type"):
        _check(
            not _get(cfg, key).startswith("full"),
            f"{key}={_get(cfg, key)!r}: the trainer passes per-token log-probs between roles, not "
            f"vocabulary-sized logits; use k1, k2, k3 or low_var_kl (with '+' for straight-through)",
        )
    from rlplat.workers.actor_loss import policy_loss_config

    try:  # the policy-loss knobs' own checks (clip_cov bounds, sapo temperatures, ...)
        policy_loss_config(algo)
    except ValueError as err:
        raise ConfigError(f"algorithm.{err}") from None
    if algo.loss_scale_factor is not None:
        _check(algo.loss_scale_factor > 0, f"algorithm.loss_scale_factor must be > 0, got {algo.loss_scale_factor}")


def _resolve_device(cfg: DictConfig) -> str:
    import torch

    device = cfg.trainer.device
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    _check(device != "cuda" or torch.cuda.is_available(), "trainer.device=cuda but no CUDA device is visible")
    return device


def _check_placement(cfg: DictConfig, device: str, world: int) -> None:
    fsdp = cfg.actor.fsdp
    if device == "cpu":
        _check(
            not fsdp.param_offload,
            "actor.fsdp.param_offload needs a GPU (trainer.device resolved to cpu)",
        )
    if cfg.trainer.ray_address == "inprocess":
        _check(world == 1, f"trainer.ray_address=inprocess runs one worker; got {world} (nnodes x workers_per_node)")
        _check(cfg.ref.placement == "colocated", "ref.placement=separate needs Ray (trainer.ray_address=inprocess)")


def validate(cfg: DictConfig) -> RunPlan:
    """Check ``cfg`` and return the derived :class:`RunPlan`; raise ConfigError on the first problem."""
    for key, registry, names in _registries():
        _check_name(cfg, key, registry, names() if names else None)
    _check_values(cfg)
    train_files, val_files = _as_paths(cfg, "data.train_files"), _as_paths(cfg, "data.val_files")
    world = cfg.trainer.nnodes * cfg.trainer.workers_per_node
    _check_algorithm(cfg)
    mini_batches, per_worker = _check_batches(cfg, world)
    device = _resolve_device(cfg)
    _check_placement(cfg, device, world)
    algo = cfg.algorithm
    needs_kl = algo.use_kl_in_reward or algo.use_kl_loss
    needs_ref = needs_kl if cfg.ref.enable is None else bool(cfg.ref.enable)
    _check(not (needs_kl and not needs_ref), "a KL term is enabled (algorithm.use_kl_*) but ref.enable=false")
    return RunPlan(
        device=device,
        world_size=world,
        seqs_per_step=cfg.data.train_batch_size_prompts * cfg.rollout.n,
        mini_batches_per_step=mini_batches,
        seqs_per_mini_batch_per_worker=per_worker,
        needs_critic=algo.adv_estimator == "gae",
        needs_ref=needs_ref,
        loss_scale_factor=float(algo.loss_scale_factor or cfg.data.max_response_length),
        train_files=train_files,
        val_files=val_files,
    )
