"""The PPO-family trainer: one controller, a loop of named stages over worker groups.

    prompts (parquet -> sampler) --repeat n, tag uid-->
    generate      actor group: rollout engine samples responses (+ rollout log-probs)
    reward        reward manager: scores per data_source -> score on the last response token (when worker
                  passes that do not need the scores follow, it runs as reward_start ... reward_wait around
                  them: the reward worker process scores while the workers compute)
    filter_groups (dynamic sampling only) drop zero-variance groups, sample more prompts
    balance_batch (several replicas only) reorder rows so every data-parallel replica gets ~equal tokens
    old_log_probs actor group: log-probs under the policy that sampled (only when the plan's
                  old_policy is "recompute"; the update takes pi_old from its own forward when it
                  starts on-policy, or from the rollout engine: algorithm.old_log_probs)
    reference     reference policy's log-probs (when a KL term is used)
    teacher       (on-policy distillation only) the teacher's log-probs of the sampled tokens
    values        critic's values (when the estimator needs them, e.g. gae)
    advantages    controller: KL in reward (optional), advantage estimator (registry), plus
                  algorithm.distill.coef x the distillation term (rlplat.algorithms.distillation)
    mask_truncated (algorithm.truncated_responses=mask only) no loss on truncated responses
    pf_ppo        (algorithm.pf_ppo.enable only) resample the batch by reward (PF-PPO)
    update_critic critic group: clipped value loss
    update_actor  actor group: policy loss + aggregation + KL loss; marks the rollout's weights stale
                  (they are sent actor -> rollout engine, in buckets, when the next generate starts)
    sync_rollout  (rollout.mode=separate only) send the new weights to the rollout pool, numbered; with
                  trainer.async_steps=K it generates the next K batches meanwhile (rlplat.trainer.rollout_queue)
    sync_reference (ref.sync_steps > 0 only) every N steps: reference <- alpha actor + (1 - alpha) reference
    dynamic_prompts (data.dynamic_prompts_fn only) the user's hook picks the next prompts
    then: validate every trainer.test_freq steps, checkpoint every trainer.save_freq, log metrics.

Each stage is a method ``stage(batch, metrics) -> batch``; a recipe subclasses the trainer and overrides
the one stage it changes, or inserts one (``stage_order = PPOTrainer.insert_stage("clip", after="advantages")``,
see recipes/README.md). The stage list is fixed at start-up from the config, so the loop itself never
branches on an algorithm's name.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

import torch
from omegaconf import DictConfig

from rlplat.algorithms import (
    KLInput,
    distill_metrics,
    get_advantage_estimator,
    kl_penalized_rewards,
    kl_penalty,
    make_kl_controller,
    pf_ppo_resample,
    reverse_kl_advantage,
)
from rlplat.config.plan import RunPlan
from rlplat.controller.dispatch import balanced_order
from rlplat.engines.routing import OLD_ROUTING
from rlplat.protocol import Batch
from rlplat.reward import token_level_scores
from rlplat.reward.batch import TrainingScores
from rlplat.rollout.agent_loop import AGENT_LOOPS
from rlplat.trainer.advantage_input import advantage_input
from rlplat.trainer.checkpoint import Checkpointer
from rlplat.trainer.components import Components
from rlplat.trainer.group_stages import GroupStages
from rlplat.trainer.metrics import (
    NonFiniteGuard, agent_metrics, data_metrics, explained_variance, throughput_metrics, timed,
)
from rlplat.trainer.prompt_hook import PromptHook
from rlplat.trainer.prompt_source import PromptSource
from rlplat.trainer.rollout_queue import RolloutQueue
from rlplat.trainer.rollouts import ColocatedRollouts, RolloutCalls, Rollouts, model_inputs
from rlplat.trainer.signals import stop_on_signals
from rlplat.trainer.summary import WallClock, write_summary
from rlplat.trainer.timeline import TRAINING_POOL_STAGES, Timeline
from rlplat.trainer.validation import Validator
from rlplat.trainer.samples import CompletionLog
from rlplat.utils.errors import WorkerDied
from rlplat.utils.progress import Progress
from rlplat.workers.actor_loss import old_log_probs_key


#: stages that neither read nor reorder the scores: rewards are computed while they run
SCORE_FREE_STAGES = frozenset({"old_log_probs", "reference", "teacher", "values"})


def overlap_scoring(stages: list[str]) -> list[str]:
    """``stages`` with ``reward`` split into ``reward_start`` ... ``reward_wait`` around the stages right after it
    that do not read the scores (when there are any)."""
    if "reward" not in stages:
        return stages
    start = end = stages.index("reward")
    while end + 1 < len(stages) and stages[end + 1] in SCORE_FREE_STAGES:
        end += 1
    if end == start:
        return stages
    return stages[:start] + ["reward_start", *stages[start + 1:end + 1], "reward_wait"] + stages[end + 1:]


def kl_in_reward(batch: Batch, estimator: str, kl_ctrl, old_log_probs: torch.Tensor, metrics: dict) -> torch.Tensor:
    """The token-level scores less ``kl_ctrl``'s coefficient times the KL to the reference (``estimator``:
    ``algorithm.kl_penalty``) at each response token; the controller then adapts to the batch's mean KL."""
    t = batch.tensors
    kl = kl_penalty(estimator, KLInput(old_log_probs, t["ref_log_probs"])) * t["response_mask"]
    rewards = kl_penalized_rewards(t["token_level_scores"], kl, t["response_mask"], kl_ctrl.value)
    mean_kl = float((kl.sum(-1) / t["response_mask"].sum(-1).clamp(min=1)).mean())
    metrics.update({"actor/reward_kl": mean_kl, "actor/kl_coef": kl_ctrl.value})
    kl_ctrl.update(mean_kl, len(batch))
    return rewards


def distillation_term(batch: Batch, old_policy: str, metrics: dict) -> torch.Tensor:
    """On-policy distillation's per-token advantage ``[batch, response_len]``, -(log pi_student - log pi_teacher)
    (:func:`~rlplat.algorithms.reverse_kl_advantage`), with pi_student the PPO ratio's pi_old: the sampling
    policy's log-probs where they come from the rollout engine, the actor's before this update where recomputed."""
    t = batch.tensors
    student, teacher = t[old_log_probs_key(t, old_policy)], t["teacher_log_probs"]
    metrics.update(distill_metrics(student, teacher, t["response_mask"]))
    return reverse_kl_advantage(student, teacher, t["response_mask"])


def score_in_background(score: Callable[[Batch], TrainingScores], batch: Batch) -> Future:
    """The scores of ``batch``: those the rollout queue computed as it arrived, else computed by ``score`` in a
    thread of its own (a reward worker process computes meanwhile)."""
    if (scored := batch.meta.pop("scores", None)) is not None:
        done = Future()
        done.set_result(scored)
        return done
    pool = ThreadPoolExecutor(1, thread_name_prefix="rlplat-reward")
    scoring = pool.submit(score, batch)
    pool.shutdown(wait=False)  # its thread ends with the task
    return scoring


class PPOTrainer(GroupStages):
    def __init__(self, cfg: DictConfig, plan: RunPlan, components: Components):
        self.cfg, self.plan, self.components = cfg, plan, components
        self.estimator = get_advantage_estimator(cfg.algorithm.adv_estimator)
        kl = cfg.algorithm.kl_ctrl
        self.kl_ctrl = make_kl_controller(kl.type, kl.coef, kl.target, kl.horizon)
        self.checkpoints = Checkpointer(cfg, plan)
        self.check_finite = NonFiniteGuard(cfg.trainer.nonfinite, cfg.trainer.max_skipped_steps)
        self.validator = Validator(cfg, components)
        self.completions = CompletionLog(cfg.trainer.output_dir)  # trainer.log_completions
        self.step = 0
        self.reward_term_weights: torch.Tensor | None = None  # [num_terms], set by the reward stage (gdpo)
        self.timeline = Timeline(cfg.trainer.output_dir)
        self.initial_val: dict[str, float] = {}  # validation before the first step (kept across resumes)
        hook = cfg.data.dynamic_prompts_fn
        self.prompt_hook = PromptHook(hook) if hook else None
        self.stages = self.build_stages()
        self.prompts = PromptSource(components, cfg.rollout.temperature)  # numbers the groups, keeps the ledger
        self.rollouts = self.build_rollouts()
        self._scoring = None  # reward_start's pending scores
        self.progress = Progress("off", cfg.trainer.total_steps)  # fit() replaces it with trainer.progress's

    def build_rollouts(self) -> Rollouts:
        """Where ``generate`` takes the step's groups from: the actor's workers (colocated), or the batches the
        rollout pool generates ahead (``rollout.mode=separate``), each scored as it arrives unless a recipe's
        ``reward`` stage scores it."""
        cfg, components = self.cfg, self.components
        baseline = self.reward if self.plan.estimator.needs_baseline else None
        calls = RolloutCalls(components, cfg.rollout.n, AGENT_LOOPS.get(cfg.rollout.agent.name).reads_rows,
                             baseline)
        if cfg.rollout.mode != "separate":
            return ColocatedRollouts(self.prompts, calls, cfg.data.train_batch_size_prompts)
        score = components.training_scores if type(self).reward is PPOTrainer.reward else None
        return RolloutQueue(cfg, self.prompts, calls, components, self.timeline, score)

    def state_dict(self) -> dict:
        """Controller-side state a checkpoint needs for an exact resume (the calls in flight are generated again)."""
        return {"kl_coef": self.kl_ctrl.value, "initial_val": self.initial_val, **self.prompts.state(),
                "in_flight": self.rollouts.state()}

    def load_state_dict(self, state: dict) -> None:
        self.kl_ctrl.value = state["kl_coef"]
        self.initial_val = state.get("initial_val") or {}
        self.prompts.load_state(state)
        self.rollouts.restore(state.get("in_flight") or [])

    def save_checkpoint(self) -> None:
        self.checkpoints.save(self.step, self.components, self.state_dict())

    def resume(self) -> int:
        """Restore the newest good checkpoint (per ``trainer.resume_mode``); the step to continue from."""
        state = self.checkpoints.maybe_resume(self.components)
        if state is None:
            return 0
        self.load_state_dict(state)
        return int(state["step"])

    # ---------------------------------------------------------------- the loop
    # The step's stages in order. A recipe inserts one with ``stage_order = PPOTrainer.insert_stage(...)``
    # (or replaces the tuple); optional stages drop out at start-up when the config does not need them.
    stage_order: tuple[str, ...] = (
        "generate", "reward", "filter_groups", "drop_zero_gradient_groups", "balance_batch", "old_log_probs",
        "reference", "teacher", "values", "advantages", "log_completions", "mask_truncated", "pf_ppo", "update_critic",
        "update_actor", "sync_rollout", "sync_reference", "dynamic_prompts",
    )

    @classmethod
    def insert_stage(cls, name: str, after: str) -> tuple[str, ...]:
        """``cls.stage_order`` with ``name`` right after ``after`` (a new tuple; nothing is copied by hand)."""
        if after not in cls.stage_order:
            raise ValueError(f"no stage {after!r} to insert {name!r} after; stages: {', '.join(cls.stage_order)}")
        at = cls.stage_order.index(after) + 1
        return cls.stage_order[:at] + (name,) + cls.stage_order[at:]

    def stage_enabled(self, name: str) -> bool:
        """Whether an optional stage runs for this config; stages not named here (a recipe's) always run."""
        cfg, plan = self.cfg, self.plan
        wanted = {
            "filter_groups": cfg.algorithm.dynamic_sampling.enable,
            "drop_zero_gradient_groups": cfg.algorithm.drop_zero_gradient_groups,
            "balance_batch": cfg.trainer.balance_batch and plan.world_size > 1,
            "mask_truncated": cfg.algorithm.truncated_responses == "mask",
            "log_completions": cfg.trainer.log_completions > 0,
            "pf_ppo": cfg.algorithm.pf_ppo.enable,
            "sync_reference": plan.needs_ref and cfg.ref.sync_steps > 0,
            "sync_rollout": cfg.rollout.mode == "separate",
            "dynamic_prompts": cfg.data.dynamic_prompts_fn is not None,
            "old_log_probs": plan.old_policy == "recompute",
            "reference": plan.needs_ref,
            "teacher": plan.needs_teacher,
            "values": plan.needs_critic,
            "update_critic": plan.needs_critic,
        }
        return wanted.get(name, True)

    def build_stages(self) -> list[str]:
        """The step's stages in order: ``stage_order`` without the optional ones this config does not need.

        When worker passes that do not read the scores (old log-probs, reference, values) follow ``reward``
        directly, scoring overlaps them: ``reward`` becomes ``reward_start`` (the scores are computed in
        the background) and ``reward_wait`` joins them before the next stage (verl's asynchronous reward
        function). A trainer that overrides ``reward`` keeps it as one stage."""
        missing = [name for name in self.stage_order if not callable(getattr(self, name, None))]
        if missing:
            raise TypeError(f"{type(self).__name__}.stage_order names stages with no method: {', '.join(missing)}")
        stages = [name for name in self.stage_order if self.stage_enabled(name)]
        return overlap_scoring(stages) if type(self).reward is PPOTrainer.reward else stages

    def train_step(self) -> dict[str, float]:
        metrics: dict[str, float] = {}
        start, wall_start = time.perf_counter(), time.time()
        batch = None
        try:
            for name in self.stages:
                self.progress.stage(name)
                stage_start = time.time()
                with timed(metrics, name):
                    batch = getattr(self, name)(batch, metrics)
                # where its time goes: the training workers' computing, or the controller's
                on_workers = name in TRAINING_POOL_STAGES or name == "generate" and self.rollouts.pool == "trainer"
                self.timeline.add("trainer" if on_workers else "controller", name, stage_start, time.time())
        finally:
            if self._scoring is not None:  # a stage failed while scoring ran: it ends before anything shuts down
                wait([self._scoring])
                self._scoring = None
        self.prompts.ledger.record(batch.non_tensors["uid"], self.step)
        metrics.update(data_metrics(batch, self.cfg.data.max_response_length))
        metrics["timing/step_s"] = time.perf_counter() - start
        metrics["timing/trainer_idle_frac"] = self.timeline.end_step(self.step, wall_start, time.time())
        metrics.update(throughput_metrics(batch, metrics))
        return metrics

    def fit(self) -> dict[str, float]:
        """Train for ``trainer.total_steps`` (from the resumed step), validating and saving on schedule; the
        finished run's actor is exported to ``hf_export`` (a stopped run's checkpoint can be exported)."""
        cfg = self.cfg
        with stop_on_signals() as stop:  # a signal stops the loop between steps (see rlplat.trainer.signals)
            self.step = resumed = self.resume()
            # a run killed after its checkpoint logged later steps: each step is recorded once
            for log in (self.components.tracker, self.validator, self.completions, self.timeline):
                log.rewind(resumed or None)
            self.clock = WallClock(cfg.trainer.output_dir, resumed=resumed > 0)
            self.progress = Progress(cfg.trainer.progress, cfg.trainer.total_steps, self.step)
            try:
                with self.progress:
                    last_val, saved = self.train_loop(stop)
            except WorkerDied as died:  # the line says which checkpoint the run resumes from
                raise died.resumable(self.checkpoints.newest()) from None
            finally:
                self.rollouts.close()
            if stop.requested and cfg.trainer.save_on_signal and self.step > max(saved, resumed):
                self.save_checkpoint()
            if not stop.requested and not (cfg.trainer.export_every_save and saved == self.step):
                self.checkpoints.export(self.step, self.components)
        if stop.requested:
            raise stop.interrupted(self.step, self.checkpoints.newest())
        self.clock.mark()
        return self.summary(self.initial_val, last_val, self.clock.seconds)

    def train_loop(self, stop) -> tuple[dict[str, float], int]:
        """Steps until ``trainer.total_steps`` or a signal; returns the last validation and the last saved step."""
        cfg, tracker = self.cfg, self.components.tracker
        saved = 0
        self.rollouts.start(self.step)
        if self.step == 0:
            self.initial_val = self.validate()
            tracker.log(self.initial_val, self.step)
        last_val = self.initial_val
        while self.step < cfg.trainer.total_steps and not stop.requested:
            self.step += 1
            metrics = self.train_step()
            last = self.step == cfg.trainer.total_steps
            if cfg.trainer.test_freq > 0 and self.step % cfg.trainer.test_freq == 0 or last:
                last_val = self.validate()
                metrics.update(last_val)
            # Logged before saving: a checkpoint of step N implies step N's metrics are on disk (a crash
            # between the two repeats step N after the resume, with the same metrics, rather than lose it).
            tracker.log(metrics, self.step)
            self.clock.mark()
            self.progress.step_done(self.step, metrics)
            if cfg.trainer.save_freq > 0 and self.step % cfg.trainer.save_freq == 0 or last:
                self.save_checkpoint()
                saved = self.step
        return last_val, saved

    def summary(self, initial: dict, final: dict, wall_time_s: float) -> dict:
        return write_summary(self.cfg, self.step, initial, final, wall_time_s, self.validator.accuracy_source,
                             list(self.components.reward_train.names))

    # ---------------------------------------------------------------- stages
    def generate(self, batch: Batch | None, metrics: dict) -> Batch:
        """This step's responses (:mod:`rlplat.trainer.rollouts`): generated now by the actor's workers
        (colocated), or taken from those the rollout pool generated ahead (``rollout.mode=separate``)."""
        out = self.rollouts.take(self.step, metrics)
        metrics.update(agent_metrics(out))
        if "truncated" in out.tensors.keys():  # an agent loop knows which trajectories ended inside a turn
            return out
        return out.union(Batch.from_dict({"truncated": self.components.truncated(out)}))

    def reward(self, batch: Batch, metrics: dict) -> Batch:
        """Add the scores: computed now, or already when the rollout queue scored the batch as it arrived."""
        scored = batch.meta.pop("scores", None) or self.components.training_scores(batch)
        return self._with_scores(batch, scored, metrics)

    def reward_start(self, batch: Batch, metrics: dict) -> Batch:
        """Start scoring ``batch`` in a background thread (the reward worker process computes); the worker
        passes run meanwhile, and :meth:`reward_wait` adds the scores."""
        self._scoring = score_in_background(self.components.training_scores, batch)
        return batch

    def reward_wait(self, batch: Batch, metrics: dict) -> Batch:
        scoring, self._scoring = self._scoring, None
        return self._with_scores(batch, scoring.result(), metrics)  # the scoring's error, if any, is raised here

    def _with_scores(self, batch: Batch, scored: TrainingScores, metrics: dict) -> Batch:
        scores, terms, self.reward_term_weights = scored.scores, scored.terms, scored.weights
        metrics.update(scored.metrics)
        if self.cfg.algorithm.truncated_responses == "penalize" and "truncated" in batch.tensors.keys():
            scores = torch.where(batch.tensors["truncated"], self.cfg.algorithm.truncated_penalty, scores)
        token_scores = token_level_scores(scores, batch.tensors["response_mask"])
        return batch.union(Batch.from_dict({"token_level_scores": token_scores, "reward_terms": terms},
                                           meta={"reward_term_names": scored.names}))

    def balance_batch(self, batch: Batch, metrics: dict) -> Batch:
        """Reorder the rows so that each data-parallel replica gets about the same number of tokens (the
        replicas wait for the slowest at every collective; verl's balance_batch). Groups stay intact in
        meaning (they are found by uid), and every later stage sees the same order."""
        lengths = batch.tensors["attention_mask"].sum(-1)
        parts = self.components.actor.layouts()[0].dp_size
        if parts == 1 or len(batch) % parts:
            return batch  # one replica (workers splitting each sequence or the model), or the calls pad it instead
        order = balanced_order(lengths, parts)
        per_replica = lengths[order].view(parts, -1).sum(-1).float()
        metrics["batch/replica_token_imbalance"] = float(per_replica.max() / per_replica.mean())  # 1 = even
        return batch[order]

    def old_log_probs(self, batch: Batch, metrics: dict) -> Batch:
        out = self.components.actor.compute_log_probs(model_inputs(batch))
        kept = ("old_log_probs", "sum_pi_squared", OLD_ROUTING)  # the last: actor.moe.router_replay=r2
        return batch.union(out.select([k for k in kept if k in out.tensors.keys()]))

    def reference(self, batch: Batch, metrics: dict) -> Batch:
        return batch.union(self.components.reference.compute_ref_log_probs(model_inputs(batch)))

    def teacher(self, batch: Batch, metrics: dict) -> Batch:
        return batch.union(self.components.teacher_workers.compute_teacher_log_probs(model_inputs(batch)))

    def values(self, batch: Batch, metrics: dict) -> Batch:
        return batch.union(self.components.critic.compute_values(model_inputs(batch)))

    def advantages(self, batch: Batch, metrics: dict) -> Batch:
        cfg, t = self.cfg.algorithm, batch.tensors
        rewards = t["token_level_scores"]
        if cfg.use_kl_in_reward:  # pi_old is recomputed for it, or the rollout's (algorithm.old_log_probs=rollout)
            rewards = kl_in_reward(batch, cfg.kl_penalty, self.kl_ctrl, t[old_log_probs_key(t, self.plan.old_policy)],
                                   metrics)
        out = self.estimator(advantage_input(batch, rewards, cfg, self.reward_term_weights))
        if "values" in t.keys():  # before this step's critic update: how well the critic predicted
            metrics["critic/vf_explained_var"] = explained_variance(out.returns, t["values"], t["response_mask"])
        if out.zero_variance is not None and "batch/real_batch_size_ratio" not in metrics:
            metrics["batch/real_batch_size_ratio"] = 1.0 - float(out.zero_variance.float().mean())
        advantages = out.advantages
        if cfg.distill.coef > 0:  # on-policy distillation's per-token term (rlplat.algorithms.distillation)
            advantages = advantages + cfg.distill.coef * distillation_term(batch, self.plan.old_policy, metrics)
        fields = {"token_level_rewards": rewards, "advantages": advantages, "returns": out.returns}
        return batch.union(Batch.from_dict(fields))

    def log_completions(self, batch: Batch, metrics: dict) -> Batch:
        """The first ``trainer.log_completions`` responses to ``completions.jsonl`` (rlplat.trainer.samples)."""
        self.completions.log(self.step, batch, self.cfg.trainer.log_completions, self.components)
        return batch

    def mask_truncated(self, batch: Batch, metrics: dict) -> Batch:
        """Responses cut off at ``data.max_response_length`` get no loss: their response mask is cleared
        after the advantages, so their scores still count in their groups' baselines and they drop out
        of the loss and its token counts (TRL / open-instruct ``mask_truncated_completions``)."""
        truncated = batch.tensors["truncated"]
        metrics["batch/masked_truncated_frac"] = float(truncated.float().mean())
        mask = batch.pop(["response_mask"]).tensors["response_mask"]
        return batch.union(Batch.from_dict({"response_mask": mask * ~truncated[:, None]}))

    def pf_ppo(self, batch: Batch, metrics: dict) -> Batch:
        """PF-PPO (2409.06957, Sec. 4; as verl does it): resample the batch, with replacement and to its own
        size, with weights from the sequence scores (``algorithm.pf_ppo``; docs/algorithms.md)."""
        opts = self.cfg.algorithm.pf_ppo
        generator = torch.Generator().manual_seed(self.cfg.trainer.seed * 1_000_003 + self.step)  # resumable
        index = pf_ppo_resample(batch.tensors["token_level_scores"].sum(-1), opts.reweight_method,
                                opts.weight_pow, generator)
        metrics["batch/pf_ppo_unique_frac"] = float(index.unique().numel() / max(len(index), 1))
        return batch[index]

    def update_critic(self, batch: Batch, metrics: dict) -> Batch:
        critic_metrics = self.components.critic.update_critic(model_inputs(batch))[0]
        # the optimizer's grad_norm and lr come unprefixed, as the actor's do
        critic_metrics = {k if "/" in k else f"critic/{k}": v for k, v in critic_metrics.items()}
        metrics.update(critic_metrics)
        self.check_finite(critic_metrics, self.step, self.checkpoints.newest(), metrics)
        return batch

    def update_actor(self, batch: Batch, metrics: dict) -> Batch:
        actor_metrics = self.components.actor.update_actor(model_inputs(batch))[0]
        actor_metrics = {k if "/" in k else f"actor/{k}": v for k, v in actor_metrics.items()}
        metrics.update(actor_metrics)
        self.check_finite(actor_metrics, self.step, self.checkpoints.newest(), metrics)
        return batch

    def sync_rollout(self, batch: Batch, metrics: dict) -> Batch:
        """``rollout.mode=separate``: send the updated weights, numbered with this step, to the rollout pool;
        its workers load them after the generations already submitted to them (:mod:`rlplat.trainer.rollout_queue`)."""
        metrics["perf/weight_sync_mb"] = self.rollouts.sync(self.step)
        return batch

    def sync_reference(self, batch: Batch, metrics: dict) -> Batch:
        """Every ``ref.sync_steps`` steps: reference <- alpha * actor + (1 - alpha) * reference with alpha =
        ``ref.sync_alpha`` (1 = copy: open-instruct's reference refresh; < 1 = Polyak mixing, TRL's
        ``sync_ref_model`` with ``ref_model_mixup_alpha``)."""
        if self.step % self.cfg.ref.sync_steps == 0:
            self.components.weights.sync_reference(self.cfg.ref.sync_alpha)
            metrics["ref/synced"] = 1.0
        return batch

    def dynamic_prompts(self, batch: Batch, metrics: dict) -> Batch:
        """Pass this step's responses to ``data.dynamic_prompts_fn`` (:class:`~rlplat.trainer.prompt_hook.PromptHook`);
        its picks are the next prompts served, in order, before the dataset's own order continues."""
        samples = PromptHook.samples(batch, self.components.decode(batch))
        self.prompts.queue(self.prompt_hook(self.step, samples, self.components.train_data))
        metrics["batch/queued_prompts"] = float(len(self.prompts.queued))
        return batch

    # ---------------------------------------------------------------- validation
    def validate(self) -> dict[str, float]:
        """Sample and score every validation prompt: :class:`~rlplat.trainer.validation.Validator`."""
        metrics = self.validator.run(self.step, self.progress, self.rollouts)
        self.rollouts.check_loaded_weights()
        return metrics
