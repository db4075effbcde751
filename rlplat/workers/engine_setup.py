"""The engines a role holds: checked against the config at start-up, then built inside the workers.

:func:`check_engine_config` runs in the controller right after :func:`rlplat.config.validate.validate`:
``actor.strategy`` and ``rollout.name`` must be registered, a chosen engine's package installed, and each
engine accepts its own sections (``TrainingEngine.check_config``, ``RolloutEngine.check_config``), so a
bad engine setting is one line before any worker starts.
"""

from __future__ import annotations

from omegaconf import DictConfig

from rlplat.config.errors import ConfigError
from rlplat.config.plan import RunPlan
from rlplat.config.validate import resolve_rollout_dtype
from rlplat.engines import TRAINING_ENGINES, TrainingEngine
from rlplat.registry import Registry
from rlplat.rollout import ROLLOUT_ENGINES, ROLLOUT_SERVER_CLIENTS, RolloutEngine, RolloutSetup


def _registered(registry: Registry, key: str, name: str) -> type:
    if name not in registry:
        raise ConfigError(f"{key}={name!r} is not registered; {registry.suggestion(name)}")
    return registry.get(name)


def check_engine_config(cfg: DictConfig, plan: RunPlan) -> None:
    """Raise ConfigError (one line naming the key) if the run's engines cannot be built on its device."""
    roles = {"actor": True, "critic": plan.needs_critic, "ref": plan.needs_ref}  # the engines this run builds
    for role in (role for role, built in roles.items() if built):
        strategy = cfg[role].strategy
        if problem := TRAINING_ENGINES.missing_requirements(strategy):
            raise ConfigError(f"{role}.strategy={strategy!r}: {problem}")
        separate_ref = role == "ref" and cfg.ref.placement == "separate"
        world = cfg.ref.workers_per_node if separate_ref else plan.world_size  # the separate pool is one node
        _registered(TRAINING_ENGINES, f"{role}.strategy", strategy).check_config(cfg, role, world, plan.device)
    rollout, name = cfg.rollout, cfg.rollout.name
    if rollout.mode == "server":
        if name not in ROLLOUT_SERVER_CLIENTS:
            raise ConfigError(f"rollout.mode=server works with rollout.name in "
                              f"{', '.join(ROLLOUT_SERVER_CLIENTS.names())}; got rollout.name={name!r}")
        if not rollout.server.url:
            raise ConfigError("rollout.mode=server needs rollout.server.url (e.g. http://HOST:8000)")
        return
    if problem := ROLLOUT_ENGINES.missing_requirements(name):
        raise ConfigError(f"rollout.name={name!r}: {problem}")
    _registered(ROLLOUT_ENGINES, "rollout.name", name).check_config(rollout.get(name), f"rollout.{name}", plan.device)


def build_rollout_engine(cfg: DictConfig, model_path: str, tokenizer, ctx) -> RolloutEngine:
    """The ``rollout.name`` engine, given the run's facts and its own section ``rollout.<name>``."""
    setup = RolloutSetup(
        model_path=model_path,
        tokenizer_path=cfg.model.tokenizer_path or model_path,
        device=ctx.device,
        dtype=resolve_rollout_dtype(cfg, ctx.device),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length,
        seed=cfg.trainer.seed,
        rank=ctx.rank,
        world_size=ctx.world_size,
        trust_remote_code=cfg.model.trust_remote_code,
    )
    if cfg.rollout.mode == "server":
        return ROLLOUT_SERVER_CLIENTS.get(cfg.rollout.name)(setup, cfg.rollout.server)
    return ROLLOUT_ENGINES.get(cfg.rollout.name)(setup, cfg.rollout.get(cfg.rollout.name))


def build_training_engine(cfg: DictConfig, role: str, model_path: str, ctx, optim: DictConfig | None = None,
                          total_steps: int = 0, value_head: bool = False) -> TrainingEngine:
    """The ``<role>.strategy`` engine (reading its section ``<role>.<strategy>``) on ``model_path``:
    trainable with ``optim`` over ``total_steps`` optimizer steps, or frozen (the reference) without."""
    strategy = cfg[role].strategy
    engine_cls, engine_cfg = TRAINING_ENGINES.get(strategy), cfg[role].get(strategy)
    if optim is None:
        return engine_cls(model_path, cfg.model, engine_cfg, ctx)
    return engine_cls(model_path, cfg.model, engine_cfg, ctx, optim, total_steps, value_head=value_head)
