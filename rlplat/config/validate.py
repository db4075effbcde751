"""Start-up validation of the composed config, before anything starts.

Names of plug-ins are checked against their registries (never against a hand-written list), counts
against the schema's ``count`` marks, cross-field rules (batch divisibility, group estimators need
``rollout.n >= 2``, ...) here, and rules the runtime also needs through the one definition both import
(e.g. the overlong buffer's bound is :class:`~rlplat.algorithms.OverlongShaping`'s). The engines check
their own sections (``actor.fsdp``, ``rollout.<name>``): :mod:`rlplat.workers.engine_setup`. The
values that follow from the config and the engines' declarations (world size, where π_old comes from,
whether a critic is needed, ...) are computed into a separate :class:`~rlplat.config.plan.RunPlan`
(:func:`rlplat.config.plan.make_plan`): the config itself is never changed after this point.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from omegaconf import DictConfig, OmegaConf

from rlplat.algorithms import OverlongShaping, estimator_spec, policy_loss_config
from rlplat.algorithms.advantages import SCALES as ADV_SCALES
from rlplat.algorithms.off_policy import LEVELS as OFF_POLICY_LEVELS
from rlplat.config.derive import data_parallel_replicas
from rlplat.config.errors import ConfigError, check
from rlplat.config.plan import OLD_LOG_PROBS, REFERENCE_PLACEMENTS, as_mixture, as_paths, reference_placement
from rlplat.config.schema import count_keys
from rlplat.registry import Registry
from rlplat.utils.progress import MODES as PROGRESS_MODES
from rlplat.utils.tracking import LOGGERS

MAX_CALLS_IN_FLIGHT = 64  # rollout.stream_groups: generation calls in flight (the controller waits for each in a thread)
#: micro-batch token budgets: None (count sequences) or a number of tokens
TOKEN_BUDGETS = ("actor.micro_batch_max_tokens_per_worker", "critic.micro_batch_max_tokens_per_worker",
                 "ref.log_prob_micro_batch_max_tokens_per_worker", "teacher.log_prob_micro_batch_max_tokens_per_worker")

ENUMS: dict[str, tuple[str, ...]] = {
    "rollout.dtype": ("auto", "float32", "bfloat16", "float16"),
    "algorithm.old_log_probs": OLD_LOG_PROBS,
    "rollout.mode": ("colocated", "separate", "server"),
    "rollout.partial": ("finish", "resume"),
    "rollout.verify_weights": ("every", "first", "off"),
    "rollout.weight_transport": ("distributed", "object_store"),
    "rollout.node_lost": ("stop", "continue"),
    "rollout.lora_sync": ("merged", "adapter"),
    "data.truncation": ("error", "left", "right", "filter"),
    "algorithm.norm_adv_scale": ADV_SCALES,
    "ref.placement": tuple(p for p in REFERENCE_PLACEMENTS if p != "none"),
    "teacher.placement": ("colocated", "separate"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "reward.isolation": ("process", "inprocess"),
    "reward.code.scoring": ("fraction", "all"),
    "reward.model.placement": ("colocated", "separate"),
    "reward.model.normalize": ("none", "batch"),
    "reward.judge.placement": ("separate", "colocated"),
    "reward.judge.verdict": ("score", "yes_no"),
    "trainer.nonfinite": ("stop", "skip"),
    "algorithm.truncated_responses": ("keep", "mask", "penalize"),
    "trainer.progress": PROGRESS_MODES,
    "algorithm.off_policy.level": OFF_POLICY_LEVELS,
}


def _get(cfg: DictConfig, key: str):
    return OmegaConf.select(cfg, key, throw_on_missing=True)


def _check_name(cfg: DictConfig, key: str, registry: Registry, names: Iterable[str] | None = None) -> None:
    value = _get(cfg, key)
    known = tuple(names) if names is not None else registry.names()
    if value not in known:
        raise ConfigError(f"{key}={value!r} is not registered; {registry.suggestion(value, known)}")


def _registries() -> list[tuple[str, Registry, Callable[[], Iterable[str]] | None]]:
    # Imported here: the registries fill up as their modules import, and plug-ins a user registers
    # before calling load_config() must count.
    from rlplat.algorithms import (
        ADVANTAGE_ESTIMATORS, AGGREGATION_MODES, KL_CONTROLLERS, KL_ESTIMATORS, OFF_POLICY_CORRECTIONS,
        POLICY_LOSSES, kl_estimator_names,
    )

    return [
        ("algorithm.adv_estimator", ADVANTAGE_ESTIMATORS, None),
        ("algorithm.policy_loss", POLICY_LOSSES, None),
        ("algorithm.loss_agg_mode", AGGREGATION_MODES, None),
        ("algorithm.kl_penalty", KL_ESTIMATORS, kl_estimator_names),
        ("algorithm.kl_loss_type", KL_ESTIMATORS, kl_estimator_names),
        ("algorithm.kl_ctrl.type", KL_CONTROLLERS, None),
        ("algorithm.off_policy.correction", OFF_POLICY_CORRECTIONS, None),
    ]


def _check_values(cfg: DictConfig) -> None:
    for key in count_keys():
        check(_get(cfg, key) >= 1, f"{key} must be >= 1, got {_get(cfg, key)}")
    for key in TOKEN_BUDGETS:
        value = _get(cfg, key)
        check(value is None or value >= 1, f"{key} must be >= 1 (tokens) or null, got {value}")
    for key, allowed in ENUMS.items():
        value = _get(cfg, key)
        check(value in allowed, f"{key}={value!r} is not one of: {', '.join(allowed)}")
    for name in _get(cfg, "trainer.logger"):
        check(name in LOGGERS, f"trainer.logger entry {name!r} is not one of: {', '.join(LOGGERS)}")
    algo, rollout = cfg.algorithm, cfg.rollout
    check(0 <= algo.gamma <= 1 and 0 <= algo.lam <= 1, "algorithm.gamma and algorithm.lam must be in [0, 1]")
    check(rollout.temperature > 0, f"rollout.temperature must be > 0 for training, got {rollout.temperature}")
    check(rollout.val_temperature >= 0, "rollout.val_temperature must be >= 0 (0 = greedy)")
    check(rollout.val_temperature > 0 or rollout.val_n == 1,
          f"rollout.val_n={rollout.val_n} with rollout.val_temperature=0 (greedy) generates the same response "
          f"{rollout.val_n} times; set rollout.val_n=1, or rollout.val_temperature > 0 (e.g. 1.0) for mean@N / pass@k")
    check(0 < rollout.top_p <= 1, f"rollout.top_p must be in (0, 1], got {rollout.top_p}")
    check(rollout.top_k == -1 or rollout.top_k > 0, f"rollout.top_k must be -1 or > 0, got {rollout.top_k}")
    lora = cfg.model.lora
    check(lora.rank >= 0, f"model.lora.rank must be >= 0 (0 = off), got {lora.rank}")
    check(lora.alpha > 0, f"model.lora.alpha must be > 0, got {lora.alpha}")
    check(lora.dropout == 0, f"model.lora.dropout={lora.dropout} would do nothing: rlplat trains without dropout (the "
                             f"model stays in eval mode, so the update's log-probs are the rollout's); leave it at 0")
    check(rollout.lora_sync == "merged" or lora.rank, f"rollout.lora_sync={rollout.lora_sync} sends LoRA adapters, "
                                                      f"and model.lora.rank=0 trains without them")
    tolerance = rollout.verify_log_prob_tol
    check(tolerance is None or tolerance > 0,
          f"rollout.verify_log_prob_tol must be > 0 (or null: by rollout.dtype), got {tolerance}")
    off = algo.off_policy
    check(off.cap > 0, f"algorithm.off_policy.cap must be > 0, got {off.cap}")
    check(0 <= off.low < 1 < off.high, f"algorithm.off_policy.low and .high must satisfy 0 <= low < 1 < high, got "
                                       f"low={off.low}, high={off.high}")
    check(off.correction != "icepop" or off.level == "token",
          f"algorithm.off_policy.correction=icepop masks tokens (level=token), got level={off.level}; use "
          f"correction=mis for a {off.level}-level mask")
    for section in ("actor", "critic"):
        optim = cfg[section].optim
        check(optim.lr > 0, f"{section}.optim.lr must be > 0, got {optim.lr}")
        check(len(optim.betas) == 2, f"{section}.optim.betas must be two numbers, got {list(optim.betas)}")
    _check_reward_values(cfg.reward)
    ref = cfg.ref
    check(ref.sync_steps >= 0, f"ref.sync_steps must be >= 0 (0 = a fixed reference), got {ref.sync_steps}")
    check(0 < ref.sync_alpha <= 1, f"ref.sync_alpha must be in (0, 1] (1 = copy the actor), got {ref.sync_alpha}")
    hook = cfg.data.dynamic_prompts_fn
    check(hook is None or (":" in hook and all(hook.rsplit(":", 1))),
          f"data.dynamic_prompts_fn={hook!r}: expected 'pkg.module:function' or 'path/to/file.py:function'")


def _check_reward_values(reward: DictConfig) -> None:
    check(reward.timeout_s > 0, f"reward.timeout_s must be > 0 seconds, got {reward.timeout_s}")
    code = reward.code
    check(code.timeout_s > 0, f"reward.code.timeout_s must be > 0 seconds, got {code.timeout_s}")
    check(code.memory_mb >= 64, f"reward.code.memory_mb must be >= 64 (a Python interpreter needs that much to "
                                f"start), got {code.memory_mb}")
    check(code.max_output_bytes > 0, f"reward.code.max_output_bytes must be > 0, got {code.max_output_bytes}")
    judge = reward.judge
    check(not (judge.model_path and judge.url), "reward.judge.model_path and reward.judge.url are both set: "
                                                "the judge is served by one of them")
    check(not judge.url or judge.model, "reward.judge.url needs reward.judge.model (the model name the server serves)")
    check(judge.score_min < judge.score_max, f"reward.judge.score_min ({judge.score_min}) must be below "
                                            f"reward.judge.score_max ({judge.score_max})")
    check(judge.timeout_s > 0 and judge.temperature >= 0, "reward.judge.timeout_s must be > 0 and "
                                                          "reward.judge.temperature >= 0")
    check(reward.num_workers is None or reward.num_workers >= 1,
          f"reward.num_workers must be >= 1 (or null: one per CPU core, up to 8), got {reward.num_workers}")
    check(reward.fail_fraction_to_stop > 0,
          f"reward.fail_fraction_to_stop must be > 0 (1 = stop when all calls fail), got {reward.fail_fraction_to_stop}")
    problem = reward_weights_problem(reward.functions, reward.weights)
    check(problem is None, problem or "")
    for name in reward.only_when_correct:
        check(name in reward.functions, f"reward.only_when_correct entry {name!r} is not in reward.functions "
                                        f"{list(reward.functions)}")


def reward_weights_problem(functions, weights) -> str | None:
    """``reward.weights`` gives one weight per entry of ``reward.functions`` (also checked by the reward
    manager when it is built from a config that skipped validation)."""
    if len(functions) != len(weights):
        return f"reward.weights has {len(weights)} entries but reward.functions has {len(functions)}"
    return None


def _check_batches(cfg: DictConfig, world: int) -> None:
    data, actor, n = cfg.data, cfg.actor, cfg.rollout.n
    step, mini = data.train_batch_size_prompts, actor.mini_batch_size_prompts
    check(
        step % mini == 0,
        f"actor.mini_batch_size_prompts={mini} must divide data.train_batch_size_prompts={step}",
    )
    mini_seqs = mini * n
    trained = ("actor", "critic") if estimator_spec(cfg.algorithm.adv_estimator).needs_values else ("actor",)
    for role in trained:
        replicas = data_parallel_replicas(cfg, role, world)
        over = f"{world} workers (trainer.nnodes x trainer.workers_per_node)" if replicas == world else \
            f"{replicas} data-parallel replicas of {role}.strategy={cfg[role].strategy} ({world} workers)"
        check(mini_seqs % replicas == 0,
              f"actor.mini_batch_size_prompts x rollout.n = {mini_seqs} sequences must divide evenly over {over}")
        key, per_worker = f"{role}.micro_batch_size_seqs_per_worker", mini_seqs // replicas
        micro = _get(cfg, key)
        check(
            per_worker % micro == 0,
            f"{key}={micro} must divide the {per_worker} sequences each worker holds per mini-batch "
            f"(actor.mini_batch_size_prompts x rollout.n / {'workers' if replicas == world else 'replicas'})",
        )


def _check_algorithm(cfg: DictConfig) -> None:
    from rlplat.algorithms import PF_PPO_METHODS, AdvantageOptions

    algo = cfg.algorithm
    spec = estimator_spec(algo.adv_estimator)
    check(
        not (spec.uses_reward_terms and algo.use_kl_in_reward),
        f"algorithm.adv_estimator={algo.adv_estimator!r} normalises each reward function's term on its own, "
        "so a KL in the reward would be lost; use algorithm.use_kl_loss=true for a KL term instead",
    )
    _check_policy_loss_options(cfg)
    try:
        AdvantageOptions(gpg_f_norm=algo.gpg_f_norm)
    except ValueError as err:
        raise ConfigError(f"algorithm.{err}") from None
    pf_ppo = algo.pf_ppo
    check(pf_ppo.reweight_method in PF_PPO_METHODS,
          f"algorithm.pf_ppo.reweight_method={pf_ppo.reweight_method!r} is not one of: {', '.join(PF_PPO_METHODS)}")
    check(pf_ppo.weight_pow >= 0, f"algorithm.pf_ppo.weight_pow must be >= 0, got {pf_ppo.weight_pow}")
    min_group = spec.min_group_size
    check(
        cfg.rollout.n >= min_group,
        f"algorithm.adv_estimator={algo.adv_estimator!r} compares responses to the same prompt and needs "
        f"rollout.n >= {min_group}, got rollout.n={cfg.rollout.n}",
    )
    if algo.dynamic_sampling.enable:
        check(
            min_group >= 2,
            "algorithm.dynamic_sampling.enable=true filters groups by score variance and needs a group "
            f"estimator; algorithm.adv_estimator={algo.adv_estimator!r} is not one",
        )
    if algo.drop_zero_gradient_groups:
        check(min_group >= 2 and not algo.use_kl_in_reward,
              f"algorithm.drop_zero_gradient_groups=true drops the groups whose scores are all equal, which give no "
              f"policy gradient only under a group baseline without a KL penalty in the reward; "
              f"algorithm.adv_estimator={algo.adv_estimator!r}, algorithm.use_kl_in_reward={algo.use_kl_in_reward}")
    if algo.overlong_buffer.enable:
        overlong = algo.overlong_buffer
        try:
            OverlongShaping(cfg.data.max_response_length, overlong.length, overlong.penalty_factor)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    if algo.loss_scale_factor is not None:
        check(algo.loss_scale_factor > 0, f"algorithm.loss_scale_factor must be > 0, got {algo.loss_scale_factor}")
    _check_distillation(cfg)


def _check_distillation(cfg: DictConfig) -> None:
    """A distillation term needs a teacher, a teacher needs a distillation term, and an estimator whose advantage
    is the term alone (``opd``) needs the term."""
    algo, teacher = cfg.algorithm, cfg.teacher.model_path
    coef = algo.distill.coef
    check(coef >= 0, f"algorithm.distill.coef must be >= 0 (0 = no distillation), got {coef}")
    check(coef > 0 or not estimator_spec(algo.adv_estimator).distills,
          f"algorithm.adv_estimator={algo.adv_estimator!r} trains on the distillation term alone, and "
          f"algorithm.distill.coef=0 turns it off; set algorithm.distill.coef > 0 (algorithm=opd sets 1.0)")
    check(coef == 0 or teacher, f"algorithm.distill.coef={coef} distills from a teacher, and teacher.model_path is "
                                f"not set; set teacher.model_path=<a model directory or hub id with the student's "
                                f"tokenizer> (docs/distillation.md)")
    check(coef > 0 or not teacher, f"teacher.model_path={teacher!r} loads a teacher that nothing reads "
                                   f"(algorithm.distill.coef=0); use algorithm=opd, or set algorithm.distill.coef > 0 "
                                   f"to add distillation to {algo.adv_estimator}'s advantage")


def _check_policy_loss_options(cfg: DictConfig) -> None:
    """The losses' own checks (PolicyLossConfig), reported against the config keys."""
    try:
        policy_loss_config(cfg.algorithm)
    except ValueError as err:
        section = "algorithm" if str(err).startswith("clip_ratio") else "algorithm.policy_loss_options"
        raise ConfigError(f"{section}.{err}") from None


def _check_placement(cfg: DictConfig, world: int) -> None:
    if cfg.trainer.ray_address == "inprocess":
        check(world == 1, f"trainer.ray_address=inprocess runs one worker; got {world} (nnodes x workers_per_node)")
        check(cfg.ref.placement == "colocated", "ref.placement=separate needs Ray (trainer.ray_address=inprocess)")
        check(cfg.teacher.placement == "colocated",
              "teacher.placement=separate needs Ray (trainer.ray_address=inprocess runs one worker in this process)")
        check(cfg.rollout.mode != "separate", "rollout.mode=separate starts a pool of rollout workers, which needs "
                                              "Ray (trainer.ray_address=inprocess runs one worker in this process)")
        check(cfg.trainer.async_steps == 0, f"trainer.async_steps={cfg.trainer.async_steps} generates while the actor "
                                            f"trains, on rollout workers of their own, which needs Ray "
                                            f"(trainer.ray_address=inprocess runs one worker in this process)")
    check(cfg.trainer.log_completions >= 0,
          f"trainer.log_completions must be >= 0 (0 = none), got {cfg.trainer.log_completions}")
    async_steps = cfg.trainer.async_steps
    check(async_steps >= 0, f"trainer.async_steps must be >= 0 (0 = synchronous), got {async_steps}")
    check(async_steps == 0 or cfg.rollout.mode == "separate",
          f"trainer.async_steps={async_steps} generates the next batches while the actor trains, which needs rollout "
          f"workers of their own: set rollout.mode=separate (rollout.mode={cfg.rollout.mode} generates on the "
          f"training workers)")
    restarts = cfg.rollout.max_restarts
    check(restarts >= 0, f"rollout.max_restarts must be >= 0 (0 = a dead rollout worker stops the run), got {restarts}")
    check(cfg.rollout.node_wait_s > 0, f"rollout.node_wait_s must be > 0, got {cfg.rollout.node_wait_s}")
    check(cfg.rollout.heartbeat_s >= 0,
          f"rollout.heartbeat_s must be >= 0 (0 = no heartbeat), got {cfg.rollout.heartbeat_s}")
    check(cfg.rollout.node_lost == "stop" or cfg.rollout.weight_transport == "object_store",
          f"rollout.node_lost={cfg.rollout.node_lost} shrinks the rollout pool, which a weight channel cannot "
          f"(rollout.weight_transport={cfg.rollout.weight_transport}: a torch.distributed group takes no new size): "
          f"set rollout.weight_transport=object_store")
    stream, batch = cfg.rollout.stream_groups, cfg.data.train_batch_size_prompts
    check(stream >= 0, f"rollout.stream_groups must be >= 0 (0 = whole batches), got {stream}")
    check(stream == 0 or cfg.rollout.mode == "separate",
          f"rollout.stream_groups={stream} streams generation calls to rollout workers of their own: set "
          f"rollout.mode=separate (rollout.mode={cfg.rollout.mode} generates each step's batch on the training workers)")
    check(cfg.rollout.partial == "finish" or cfg.rollout.mode == "separate",
          f"rollout.partial={cfg.rollout.partial} loads weight updates into rollout workers of their own while they "
          f"generate: set rollout.mode=separate (rollout.mode={cfg.rollout.mode} generates between updates)")
    check(cfg.rollout.partial == "finish" or cfg.rollout.agent.name == "single_turn",
          f"rollout.partial=resume pauses single-turn generation for a weight update; rollout.agent.name="
          f"{cfg.rollout.agent.name} keeps each conversation's cache across turns: use rollout.partial=finish")
    check(stream == 0 or batch % stream == 0,
          f"rollout.stream_groups={stream} must divide data.train_batch_size_prompts={batch} (a step takes whole calls)")
    calls = batch // stream * (async_steps + 1) if stream > 0 and batch % stream == 0 else 0
    check(calls <= MAX_CALLS_IN_FLIGHT,
          f"rollout.stream_groups={stream} keeps {calls} generation calls in flight (data.train_batch_size_prompts="
          f"{batch} / {stream} per step, for trainer.async_steps + 1 = {async_steps + 1} steps), each waited for by a "
          f"thread of the controller; at most {MAX_CALLS_IN_FLIGHT}: use calls of at least "
          f"{-(-batch * (async_steps + 1) // MAX_CALLS_IN_FLIGHT)} groups (dividing the batch)")


def validate(cfg: DictConfig) -> None:
    """Check ``cfg``; raise ConfigError on the first problem."""
    for key, registry, names in _registries():
        _check_name(cfg, key, registry, names() if names else None)
    _check_values(cfg)
    as_paths(cfg, "data.train_files")
    check(all(kind == "all" for _, kind, _ in as_mixture(cfg, "data.val_files")),
          "data.val_files takes paths (every validation prompt is scored); mixture weights go in data.train_files")
    world = cfg.trainer.nnodes * cfg.trainer.workers_per_node
    _check_algorithm(cfg)
    _check_batches(cfg, world)
    _check_placement(cfg, world)
    reference_placement(cfg)


def resolve_device(cfg: DictConfig) -> str:
    """``trainer.device`` with ``auto`` resolved to cuda when a GPU is visible, else cpu."""
    import torch

    device = cfg.trainer.device
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    check(device != "cuda" or torch.cuda.is_available(), "trainer.device=cuda but no CUDA device is visible")
    return device
