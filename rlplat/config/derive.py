"""Batch sizes a user leaves unset (``None``) follow the sizes they did set.

Filled in once while the config is composed (like an interpolation), before validation, so that changing
one knob (``rollout.n=4``, ``data.train_batch_size_prompts=8``, ``trainer.workers_per_node=8``) keeps a
valid config; a size set explicitly is never changed, and validation still checks it.

* ``actor.mini_batch_size_prompts``: the largest divisor of ``data.train_batch_size_prompts`` <= 16.
* ``actor.micro_batch_size_seqs_per_worker``: the largest divisor of the per-worker mini-batch
  (mini-batch prompts x ``rollout.n`` / the actor's data-parallel replicas: every worker of a replica
  holds its share) <= 128; ``critic.micro_batch_size_seqs_per_worker``: the actor's value, or the largest
  divisor of the critic's own per-worker share below it when the critic forms other replicas.

One alias is resolved here too: ``algorithm.tis_cap=C`` is ``algorithm.off_policy.correction=tis``,
``level=token``, ``cap=C`` (what verl's and TRL's token truncation maps to), so the rest of rlplat reads
``algorithm.off_policy`` only.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf, open_dict

from rlplat.config.errors import ConfigError

MINI_BATCH_PROMPTS_CAP = 16  # 4 optimizer steps per 64-prompt step: the quickstart's tuned value
MICRO_BATCH_SEQS_CAP = 128  # activations of 128 sequences fit a CPU or one GPU for the models we test


def largest_divisor_at_most(n: int, cap: int) -> int:
    """The largest d <= cap with n % d == 0 (1 when n < 1)."""
    return next((d for d in range(min(n, cap), 0, -1) if n % d == 0), 1)


def replica_size(cfg: DictConfig, role: str) -> int:
    """The workers one model replica of ``role``'s training engine spans, as the engine's config section
    (``<role>.<strategy>``) declares it (its ``replica_size``: e.g. Megatron's tensor x pipeline-parallel
    ranks); 1 for an engine without such a section (every worker its own replica)."""
    section = cfg[role].get(cfg[role].strategy)
    declared = getattr(OmegaConf.get_type(section), "replica_size", None) if isinstance(section, DictConfig) else None
    return declared(section) if declared is not None else 1


def model_of(cfg: DictConfig, role: str) -> DictConfig:
    """The ``model`` section as ``role``'s engine loads it: ``model`` itself, or for on-policy distillation's teacher
    the same settings (remote code, attention) on ``teacher.model_path``."""
    if role != "teacher":
        return cfg.model
    section = OmegaConf.create(OmegaConf.to_container(cfg.model))
    section.path, section.tokenizer_path = cfg.teacher.model_path, None
    return section


def data_parallel_replicas(cfg: DictConfig, role: str, world: int) -> int:
    """The model replicas ``role``'s training engine forms on ``world`` workers, each taking its share of a
    batch (:func:`replica_size` workers each, at least 1)."""
    split = replica_size(cfg, role)
    return max(1, world // split) if isinstance(split, int) and split >= 1 else world  # a bad size: validation says so


def derive_batch_sizes(cfg: DictConfig) -> None:
    """Replace the ``None`` batch sizes of ``cfg`` (in place) by the values above."""
    actor, critic = cfg.actor, cfg.critic
    with open_dict(cfg):
        if actor.mini_batch_size_prompts is None:
            actor.mini_batch_size_prompts = largest_divisor_at_most(cfg.data.train_batch_size_prompts,
                                                                    MINI_BATCH_PROMPTS_CAP)
        world = cfg.trainer.nnodes * cfg.trainer.workers_per_node
        mini_seqs = actor.mini_batch_size_prompts * cfg.rollout.n

        def per_worker(role: str) -> int:
            replicas = data_parallel_replicas(cfg, role, world)
            return mini_seqs // replicas if mini_seqs % replicas == 0 else MICRO_BATCH_SEQS_CAP

        if actor.micro_batch_size_seqs_per_worker is None:
            actor.micro_batch_size_seqs_per_worker = largest_divisor_at_most(per_worker("actor"), MICRO_BATCH_SEQS_CAP)
        if critic.micro_batch_size_seqs_per_worker is None:
            critic.micro_batch_size_seqs_per_worker = largest_divisor_at_most(
                per_worker("critic"), actor.micro_batch_size_seqs_per_worker)


def resolve_aliases(cfg: DictConfig) -> None:
    """``algorithm.tis_cap`` into ``algorithm.off_policy`` (in place; ``tis_cap`` is then null, so the run's
    config.yaml says it once); both set is one ConfigError."""
    algo = cfg.algorithm
    if algo.tis_cap is None:
        return
    if not isinstance(algo.tis_cap, (int, float)) or algo.tis_cap <= 0:
        raise ConfigError(f"algorithm.tis_cap must be > 0 (or null = off), got {algo.tis_cap}")
    if algo.off_policy.correction != "none":
        raise ConfigError(f"algorithm.tis_cap={algo.tis_cap} is the alias of algorithm.off_policy.correction=tis "
                          f"level=token cap={algo.tis_cap}, and algorithm.off_policy.correction="
                          f"{algo.off_policy.correction} is set too: keep one")
    with open_dict(cfg):
        algo.off_policy.correction, algo.off_policy.level, algo.off_policy.cap = "tis", "token", algo.tis_cap
        algo.tis_cap = None
