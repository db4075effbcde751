"""The engines a role holds: chosen and checked at start-up, then built inside the workers.

:func:`plan_run` runs in the controller after the config's own validation (:func:`rlplat.config.load_config`):
``<role>.strategy`` and ``rollout.name`` must be registered and a chosen engine's package installed; the
chosen engines declare what they do (the dtype they compute in, whether a rollout engine's log-probs are the
actor's, whether it sleeps between rollouts) and the run plan is made from the config and those
declarations; then each engine checks its own sections (``TrainingEngine.check_config``,
``RolloutEngine.check_config``), so a bad engine setting is one line before any worker starts.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from rlplat.config.errors import ConfigError
from rlplat.config.plan import EngineDeclarations, RolloutDeclaration, RunPlan, make_plan
from rlplat.config.validate import resolve_device
from rlplat.engines import TRAINING_ENGINES, TrainingEngine
from rlplat.engines.routing import ROUTER_REPLAY
from rlplat.models.embedded import known_config
from rlplat.models.moe import is_moe
from rlplat.models.vision import is_vision
from rlplat.registry import Registry
from rlplat.rollout import ROLLOUT_ENGINES, ROLLOUT_SERVER_CLIENTS, RolloutEngine, RolloutSetup
from rlplat.rollout.agent_loop import AGENT_LOOPS, AgentLoop, check_agent_config


def _registered(registry: Registry, key: str, name: str, require_installed: bool = True) -> type:
    """The class registered under ``name``, imported; ConfigError if it is unknown or (``require_installed``)
    its package missing."""
    if require_installed and (problem := registry.missing_requirements(name)):
        raise ConfigError(f"{key}={name!r}: {problem}")
    if name not in registry:
        raise ConfigError(f"{key}={name!r} is not registered; {registry.suggestion(name)}")
    return registry.get(name, require_installed=require_installed)


def _rollout_engine_class(cfg: DictConfig, require_installed: bool = True) -> type[RolloutEngine]:
    rollout, name = cfg.rollout, cfg.rollout.name
    if rollout.mode == "server":
        if name not in ROLLOUT_SERVER_CLIENTS:
            raise ConfigError(f"rollout.mode=server works with rollout.name in "
                              f"{', '.join(ROLLOUT_SERVER_CLIENTS.names())}; got rollout.name={name!r}")
        if not rollout.server.url:
            raise ConfigError("rollout.mode=server needs rollout.server.url (e.g. http://HOST:8000)")
        return ROLLOUT_SERVER_CLIENTS.get(name)
    return _registered(ROLLOUT_ENGINES, "rollout.name", name, require_installed)


def rollout_declaration(cfg: DictConfig, device: str, require_installed: bool = True) -> RolloutDeclaration:
    """What the rollout engine (``rollout.name``, or its server client) declares for its section on ``device``."""
    section = cfg.rollout.server if cfg.rollout.mode == "server" else cfg.rollout.get(cfg.rollout.name)
    return _rollout_engine_class(cfg, require_installed).declare(section, device)


def plan_run(cfg: DictConfig, device: str | None = None, require_installed: bool = True) -> RunPlan:
    """The run's plan from a validated ``cfg`` and its engines' declarations; raises ConfigError (one line
    naming the key) if an engine cannot be built, or cannot run its settings, on the run's device
    (``trainer.device`` resolved here). ``device`` and ``require_installed=False`` plan a run for another
    machine, as ``rlplat.tools.plan`` does: a GPU run from a machine without one, and an engine whose package
    is installed only where the run will run."""
    device = device or resolve_device(cfg)
    actor_cls = _registered(TRAINING_ENGINES, "actor.strategy", cfg.actor.strategy, require_installed)
    rollout_cls = _rollout_engine_class(cfg, require_installed)
    rollout_section = cfg.rollout.server if cfg.rollout.mode == "server" else cfg.rollout.get(cfg.rollout.name)
    rollout = rollout_declaration(cfg, device, require_installed)
    declarations = EngineDeclarations(actor_dtype=actor_cls.computes_in(cfg.actor.get(cfg.actor.strategy), device),
                                      rollout=rollout)
    plan = make_plan(cfg, device, declarations)
    check_vision(cfg, plan, rollout, known_config(cfg.model))
    # the engines this run builds, and the workers each is split over (a separate reference or teacher pool: one node)
    roles = {"actor": True, "critic": plan.needs_critic, "ref": plan.needs_ref, "teacher": plan.needs_teacher}
    own_pool = {"ref": plan.reference == "separate", "teacher": plan.teacher == "separate"}
    for role in (role for role, built in roles.items() if built):
        engine_cls = _registered(TRAINING_ENGINES, f"{role}.strategy", cfg[role].strategy, require_installed)
        world = cfg[role].workers_per_node if own_pool.get(role) else plan.world_size
        engine_cls.check_config(cfg, role, world, device)
    if cfg.rollout.mode != "server":
        rollout_cls.check_config(rollout_section, f"rollout.{cfg.rollout.name}", device)
    separate, verify = cfg.rollout.mode == "separate", cfg.rollout.verify_weights
    if separate and verify != "off" and not (rollout.shows_weights or rollout.scores_sequences):
        raise ConfigError(f"rollout.verify_weights={verify} compares the checksums of the weights the rollout "
                          f"engine holds and its log-probs of a probe with the actor's, and the {cfg.rollout.name} "
                          f"engine can do neither; set rollout.verify_weights=off")
    if cfg.rollout.partial == "resume" and not rollout.pauses_for_updates:
        raise ConfigError(f"rollout.partial=resume loads a weight update between two tokens of a generation under way, "
                          f"which the {cfg.rollout.name} engine cannot do with these settings; use rollout.partial=finish")
    if cfg.rollout.lora_sync == "adapter" and not rollout.applies_adapters:
        server = cfg.rollout.mode == "server"
        engine = "a rollout server (rollout.mode=server)" if server else f"the {cfg.rollout.name} engine"
        raise ConfigError(f"rollout.lora_sync=adapter: {engine} cannot apply LoRA adapters from rlplat (yet); "
                          f"use rollout.lora_sync=merged")
    check_agent_config(cfg.rollout.agent)
    check_experts(cfg, rollout)
    return plan


def check_experts(cfg: DictConfig, rollout) -> None:
    """A mixture of experts' settings against the rollout engine's declaration (``rollout``):
    ``actor.moe.router_replay`` a known mode, with experts to replay, and for r3 an engine and an agent loop that
    return the rollout's routing."""
    replay = cfg.actor.moe.router_replay
    if replay not in ROUTER_REPLAY:
        raise ConfigError(f"actor.moe.router_replay={replay!r} is not one of: {', '.join(ROUTER_REPLAY)}")
    if replay == "none":
        return
    known = known_config(cfg.model)
    if known is not None and not is_moe(known):
        raise ConfigError(f"actor.moe.router_replay={replay}: model.path={cfg.model.path} is a dense model (no "
                          f"experts to route); set actor.moe.router_replay=none")
    if replay == "r3" and not rollout.returns_routing:
        raise ConfigError(f"actor.moe.router_replay=r3 replays the rollout engine's routing, which the "
                          f"{cfg.rollout.name} engine does not return with these settings (docs/moe.md); "
                          f"use r2 or none")
    if replay == "r3" and not AGENT_LOOPS.get(cfg.rollout.agent.name).carries_routing:
        raise ConfigError(f"actor.moe.router_replay=r3: the {cfg.rollout.agent.name} agent loop's trajectories do not "
                          f"carry the rollout's routing (docs/moe.md); use r2 or none")


def check_vision(cfg: DictConfig, plan: RunPlan, rollout, config) -> None:
    """What a vision-language model (``model.path``) runs with besides what the training engines check
    (``trains_vision``; docs/vision.md): single-turn rollouts from an engine that takes images, no critic, no
    LoRA. ``config``: the model's (None: not known yet, a hub id before :func:`rlplat.trainer.preflight.preflight`
    fetches it)."""
    if config is None or not is_vision(config):
        return
    what = f"model.path={cfg.model.path} is a vision-language model"
    if not rollout.takes_images:
        why = f" ({rollout.images_refused_because})" if rollout.images_refused_because else ""
        raise ConfigError(f"{what}, and the {cfg.rollout.name} engine does not generate from images with these "
                          f"settings{why} (docs/vision.md); use rollout.name=hf "
                          f"(rollout.hf.use_model_generation_config=false)")
    if plan.needs_critic:
        raise ConfigError(f"{what}: algorithm.adv_estimator={cfg.algorithm.adv_estimator} needs a critic, which "
                          f"rlplat does not build for one (yet); use a critic-free estimator (grpo, rloo, ...)")
    if cfg.rollout.agent.name != "single_turn":
        raise ConfigError(f"{what}: the {cfg.rollout.agent.name} agent loop's conversations do not carry images "
                          f"(yet); use rollout.agent.name=single_turn")
    if cfg.model.lora.rank:
        raise ConfigError(f"{what}: model.lora.rank={cfg.model.lora.rank}: LoRA does not tell the vision tower's "
                          f"layers from the language model's (yet); set model.lora.rank=0")


def build_agent_loop(cfg: DictConfig, plan: RunPlan, tokenizer) -> AgentLoop:
    """The ``rollout.agent.name`` loop that turns prompts into trajectories with the rollout engine."""
    return AGENT_LOOPS.get(cfg.rollout.agent.name)(cfg.rollout.agent, tokenizer, plan.response_length)


def build_rollout_engine(cfg: DictConfig, plan: RunPlan, model_path: str, tokenizer, ctx) -> RolloutEngine:
    """The ``rollout.name`` engine, given the run's facts and its own section ``rollout.<name>``."""
    setup = RolloutSetup(
        model_path=model_path,
        tokenizer_path=cfg.model.tokenizer_path or model_path,
        device=ctx.device,
        dtype=getattr(torch, plan.rollout_dtype),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_model_len=cfg.data.max_prompt_length + plan.response_length,
        seed=cfg.trainer.seed,
        rank=ctx.rank,
        world_size=ctx.world_size,
        trust_remote_code=cfg.model.trust_remote_code,
        lora_rank=cfg.model.lora.rank if cfg.rollout.lora_sync == "adapter" else 0,
        frozen_vision=cfg.actor.vision.freeze,
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
    # read by a mixture of experts
    moe = {"moe": cfg.actor.moe} if role in ("actor", "ref", "teacher") and engine_cls.trains_experts else {}
    if optim is None:
        return engine_cls(model_path, cfg.model, engine_cfg, ctx, **moe)
    # the actor's LoRA adapters, initialised alike on every rank
    extra = {"lora": cfg.model.lora, "seed": cfg.trainer.seed} if role == "actor" and cfg.model.lora.rank else {}
    if role == "actor" and engine_cls.trains_vision:  # read by a vision-language model
        extra["vision"] = cfg.actor.vision
    return engine_cls(model_path, cfg.model, engine_cfg, ctx, optim, total_steps, value_head=value_head, **extra, **moe)
