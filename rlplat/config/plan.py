"""The run plan: what follows from a validated config and from what the chosen engines declare, computed
once and read by everything that would otherwise derive it again.

:func:`make_plan` is called by :func:`rlplat.workers.engine_setup.plan_run`, which gathers the engines'
:class:`EngineDeclarations` (this layer knows no engine: engines say what they do, the plan reads it).
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlplat.algorithms import EstimatorSpec, estimator_spec
from rlplat.config.errors import check

OLD_LOG_PROBS = ("auto", "recompute", "rollout")  # algorithm.old_log_probs
REFERENCE_PLACEMENTS = ("none", "colocated", "separate")


@dataclass(frozen=True)
class RolloutDeclaration:
    """What a rollout engine declares about itself, for its config section, on the run's device."""

    auto_dtype: str  # what rollout.dtype=auto resolves to ("float32" | "bfloat16" | "float16")
    # it samples with the actor's own model code, so in float32 on both sides its log-probs are the actor's
    # own to float error (then the PPO ratio's pi_old can be taken from it: algorithm.old_log_probs=auto)
    actor_log_probs: bool
    sleeps: bool  # it frees its memory between rollouts (the worker wakes it before and puts it to sleep after)
    applies_adapters: bool = False  # it applies LoRA adapters itself (rollout.lora_sync=adapter)
    shows_weights: bool = False  # it reports checksums of the weights it holds (rollout.verify_weights)
    scores_sequences: bool = False  # it scores a given token sequence: the weight sync's log-prob probe
    # it loads a weight update between two tokens of a generation under way and goes on (rollout.partial=resume)
    pauses_for_updates: bool = False
    # a mixture of experts' rollouts carry the experts each token was routed to (routed_experts; an agent loop's too:
    # AgentLoop.carries_routing), which actor.moe.router_replay=r3 replays and moe/routing_mismatch_frac compares with
    returns_routing: bool = False
    # it generates from prompts that show images (a vision-language model's; docs/vision.md), or why not here
    takes_images: bool = False
    images_refused_because: str = ""


@dataclass(frozen=True)
class EngineDeclarations:
    """The chosen engines' declarations that the plan reads."""

    actor_dtype: str  # the dtype the actor's training engine computes in ("float32" | "bfloat16")
    rollout: RolloutDeclaration


@dataclass(frozen=True)
class RunPlan:
    """Values derived from a validated config and the engines' declarations (never stored back into the config)."""

    device: str  # "cpu" | "cuda"
    world_size: int  # actor/rollout workers over all nodes
    mini_batches_per_step: int
    estimator: EstimatorSpec  # what algorithm.adv_estimator needs of the run
    # where the reference policy lives: "none" | "colocated" (a copy in the actor's worker) | "separate" |
    # "adapters" (LoRA: the actor's own model with its adapters off, or with a synced copy of them)
    reference: str
    # where on-policy distillation's teacher lives: "none" | "colocated" (in the actor's workers) | "separate"
    teacher: str
    # where the PPO ratio's pi_old comes from: "update" (the update's own forward: it starts on the policy
    # that sampled) | "rollout" (the rollout engine's log-probs) | "recompute" (the old_log_probs stage)
    old_policy: str
    actor_dtype: str  # the actor's compute dtype
    rollout_dtype: str  # the dtype the rollout engine generates in (the actor's weights are sent in it)
    rollout_sleeps: bool
    # the rollout engine's log-probs are the actor's own to float error: it samples with the actor's model
    # code, and both compute in float32
    rollout_log_probs_exact: bool
    loss_scale_factor: float  # for seq-mean-token-sum-norm
    # tokens after the prompt (R of the batch): data.max_response_length, or the agent loop's total budget
    response_length: int
    # a mixture of experts' rollouts carry each token's experts (routed_experts): the rollout engine returns them
    rollout_routing: bool
    train_files: tuple[str, ...]
    val_files: tuple[str, ...]
    # data.train_files as (path, kind, value) (as_mixture): how many rows each file gives an epoch
    train_mixture: tuple[tuple[str, str, float], ...] = ()

    @property
    def needs_critic(self) -> bool:
        return self.estimator.needs_values

    @property
    def needs_ref(self) -> bool:
        return self.reference != "none"

    @property
    def needs_teacher(self) -> bool:
        return self.teacher != "none"


def reference_placement(cfg: DictConfig) -> str:
    """Where the reference policy lives: none unless a KL term needs it (or ``ref.enable=true``), else
    ``ref.placement``."""
    algo = cfg.algorithm
    needs_kl = algo.use_kl_in_reward or algo.use_kl_loss
    wanted = needs_kl if cfg.ref.enable is None else bool(cfg.ref.enable)
    check(not (needs_kl and not wanted), "a KL term is enabled (algorithm.use_kl_*) but ref.enable=false")
    check(not cfg.ref.sync_steps or wanted, f"ref.sync_steps={cfg.ref.sync_steps} syncs a reference policy, but "
                                            f"this run has none (no KL term; set ref.enable=true to keep one)")
    if not wanted:
        return "none"
    if cfg.model.lora.rank and cfg.ref.placement == "colocated":
        # the actor's own model with its adapters off, or a synced copy of the adapters: no copy of the model
        return "adapters"
    return cfg.ref.placement


def old_policy(cfg: DictConfig, spec: EstimatorSpec, mini_batches: int, engines: EngineDeclarations,
               rollout_dtype: str) -> str:
    """Where the PPO ratio's π_old comes from (:attr:`RunPlan.old_policy`).

    "update": one epoch over one mini-batch starts from the policy that sampled, so the update's own
    forward gives π_old exactly; unless a KL in the reward, on-policy distillation (``algorithm.distill``) or
    the estimator (``needs_sum_pi_squared``) reads the actor's log-probs before the update, or
    ``trainer.async_steps`` > 0 (an older policy sampled). "rollout": the rollout engine's log-probs, which skips
    the actor's log-prob pass over the batch (verl's rollout-correction bypass mode). The PPO ratio is
    then taken against the policy that actually sampled. ``auto`` picks it only where those log-probs are
    the actor's own to float error: the rollout engine declares that it samples with the actor's model
    code, and both sides compute in float32 (0.5e-6 mean |Δ log π| on the Quickstart; docs/concepts.md).
    "recompute": the actor's pass (always with ``actor.moe.router_replay=r2``, whose routing that pass records).
    """
    algo = cfg.algorithm
    if cfg.actor.moe.router_replay == "r2":  # the actor's pass records the routing the update replays
        return "recompute"
    reads_sum_sq = spec.needs_sum_pi_squared
    # with trainer.async_steps > 0 the batch was sampled by weights up to K updates older than the actor's
    stale = cfg.trainer.async_steps > 0
    reads_early = algo.use_kl_in_reward or reads_sum_sq or algo.distill.coef > 0  # before the update
    if cfg.actor.ppo_epochs == 1 and mini_batches == 1 and not reads_early and not stale:
        return "update"
    if algo.old_log_probs == "rollout":
        check(algo.off_policy.correction == "none",
              f"algorithm.off_policy.correction={algo.off_policy.correction} (or algorithm.tis_cap) weights tokens by "
              f"pi_old / pi_rollout, which is 1 with algorithm.old_log_probs=rollout; set algorithm.old_log_probs=recompute")
        check(not reads_sum_sq, f"algorithm.adv_estimator={algo.adv_estimator!r} reads sum_pi_squared from the "
                                f"actor's log-prob pass; set algorithm.old_log_probs=recompute")
        return "rollout"
    if algo.old_log_probs == "recompute" or algo.off_policy.correction != "none" or algo.use_kl_in_reward or reads_sum_sq:
        return "recompute"
    return "rollout" if log_probs_exact(engines, rollout_dtype) else "recompute"


def log_probs_exact(engines: EngineDeclarations, rollout_dtype: str) -> bool:
    """:attr:`RunPlan.rollout_log_probs_exact`."""
    return engines.rollout.actor_log_probs and rollout_dtype == engines.actor_dtype == "float32"


def response_length(cfg: DictConfig) -> int:
    """The tokens a rollout may hold after its prompt: one response of ``data.max_response_length`` with
    the single-turn loop; with a multi-turn agent loop every assistant turn and observation together,
    ``rollout.agent.max_total_tokens`` (default ``max_turns`` x ``data.max_response_length``)."""
    agent, turn = cfg.rollout.agent, cfg.data.max_response_length
    if agent.name == "single_turn":
        return turn
    total = agent.max_total_tokens if agent.max_total_tokens is not None else agent.max_turns * turn
    check(total >= turn, f"rollout.agent.max_total_tokens={total} is below data.max_response_length={turn} "
                         f"(one assistant turn must fit)")
    return total


def make_plan(cfg: DictConfig, device: str, engines: EngineDeclarations) -> RunPlan:
    """The plan of a config that passed :func:`rlplat.config.validate.validate`, on ``device``, with the
    chosen engines' declarations. Raises ConfigError for a combination only the plan can see."""
    algo = cfg.algorithm
    spec = estimator_spec(algo.adv_estimator)
    mini_batches = cfg.data.train_batch_size_prompts // cfg.actor.mini_batch_size_prompts
    rollout_dtype = engines.rollout.auto_dtype if cfg.rollout.dtype == "auto" else cfg.rollout.dtype
    return RunPlan(
        device=device,
        world_size=cfg.trainer.nnodes * cfg.trainer.workers_per_node,
        mini_batches_per_step=mini_batches,
        estimator=spec,
        reference=reference_placement(cfg),
        teacher=cfg.teacher.placement if cfg.algorithm.distill.coef > 0 else "none",
        old_policy=old_policy(cfg, spec, mini_batches, engines, rollout_dtype),
        actor_dtype=engines.actor_dtype,
        rollout_dtype=rollout_dtype,
        rollout_sleeps=engines.rollout.sleeps,
        rollout_log_probs_exact=log_probs_exact(engines, rollout_dtype),
        loss_scale_factor=float(algo.loss_scale_factor or response_length(cfg)),
        response_length=response_length(cfg),
        rollout_routing=engines.rollout.returns_routing,
        train_files=as_paths(cfg, "data.train_files"),
        val_files=as_paths(cfg, "data.val_files"),
        train_mixture=as_mixture(cfg, "data.train_files"),
    )


def as_paths(cfg: DictConfig, key: str) -> tuple[str, ...]:
    """``key`` (``data.train_files`` / ``data.val_files``): its paths, in order (a mixture's too,
    :func:`as_mixture`)."""
    return tuple(path for path, _, _ in as_mixture(cfg, key))


#: how a mixture's number for a file reads: ``weight`` relative to the others' (``{path, weight}`` entries),
#: ``share`` of the file's own rows per epoch and ``count`` rows per epoch (open-instruct's list form:
#: ``[a.parquet, "1.0", b.parquet, "0.3"]`` or ``"2000"``); ``all`` for a plain path (every row, once an epoch)
MIXTURE_KINDS = ("weight", "share", "count", "all")


def as_mixture(cfg: DictConfig, key: str) -> tuple[tuple[str, str, float], ...]:
    """``key``'s files as ``(path, kind, value)`` (:data:`MIXTURE_KINDS`): one path, a list of paths, a list of
    ``{path, weight}`` entries, or open-instruct's ``[path, number, path, number, ...]``. ConfigError otherwise."""
    value = OmegaConf.select(cfg, key)
    items = [value] if isinstance(value, str) else list(value) if isinstance(value, ListConfig) else None
    expected = (f"{key} must be a path, a non-empty list of paths, a list of {{path: ..., weight: ...}} entries, or "
                f"open-instruct's [path, number, path, number, ...]; got {value!r}")
    check(bool(items), expected)
    if all(isinstance(item, DictConfig) for item in items):
        parts = []
        for i, item in enumerate(items):
            check(set(item.keys()) == {"path", "weight"} and isinstance(item.path, str) and item.path,
                  f"{key}[{i}] must be {{path: <file>, weight: <number>}}, got {dict(item)!r}")
            check(isinstance(item.weight, (int, float)) and item.weight > 0,
                  f"{key}[{i}].weight must be a number > 0, got {item.weight!r}")
            parts.append((item.path, "weight", float(item.weight)))
        return tuple(parts)
    check(all(isinstance(item, str) and item for item in items), expected)
    numbers = [_number(item) for item in items[1::2]]
    if len(items) % 2 == 0 and all(n is not None for n in numbers) and not any(_number(p) is not None
                                                                               for p in items[::2]):
        parts = []
        for path, text, number in zip(items[::2], items[1::2], numbers):
            check(number > 0, f"{key}: the number after {path} must be > 0, got {text}")
            counted = "." not in text and number > 1  # open-instruct: a fraction of the file, or a row count
            parts.append((path, "count" if counted else "share", number))
        return tuple(parts)
    return tuple((path, "all", 1.0) for path in items)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
