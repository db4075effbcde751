"""The PPO-family trainer: one controller, a loop of named stages over worker groups.

    prompts (parquet -> sampler) --repeat n, tag uid-->
    generate      actor group: rollout engine samples responses (+ rollout log-probs)
    reward        reward manager: scores per data_source -> score on the last response token
    filter_groups (dynamic sampling only) drop zero-variance groups, sample more prompts
    old_log_probs actor group: log-probs under the policy that sampled (skipped when it provably
                  equals the one the update starts from: one epoch, one mini-batch)
    reference     reference policy's log-probs (when a KL term is used)
    values        critic's values (when the estimator needs them, e.g. gae)
    advantages    controller: KL in reward (optional), advantage estimator (registry)
    update_critic critic group: clipped value loss
    update_actor  actor group: policy loss + aggregation + KL loss
    sync_weights  actor -> rollout engine
    then: validate every trainer.test_freq steps, checkpoint every trainer.save_freq, log metrics.

Each stage is a method ``stage(batch, metrics) -> batch``; a recipe subclasses the trainer and overrides
the one stage it changes, or inserts one (``stage_order = PPOTrainer.insert_stage("clip", after="advantages")``,
see recipes/README.md). The stage list is fixed at start-up from the config, so the loop itself never
branches on an algorithm's name.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig

from rlplat.algorithms import (
    AdvantageInput,
    AdvantageOptions,
    KLInput,
    get_advantage_estimator,
    kl_penalized_rewards,
    kl_penalty,
    make_kl_controller,
)
from rlplat.config.validate import RunPlan
from rlplat.protocol import Batch
from rlplat.reward import token_level_scores
from rlplat.trainer.components import Components
from rlplat.trainer.metrics import data_metrics, timed, validation_metrics


class PPOTrainer:
    def __init__(self, cfg: DictConfig, plan: RunPlan, components: Components):
        self.cfg, self.plan, self.c = cfg, plan, components
        self.estimator = get_advantage_estimator(cfg.algorithm.adv_estimator)
        self.kl_ctrl = make_kl_controller(
            cfg.algorithm.kl_ctrl.type, cfg.algorithm.kl_ctrl.coef, cfg.algorithm.kl_ctrl.target,
            cfg.algorithm.kl_ctrl.horizon,
        )
        self.step = 0
        self.prompts_seen = 0  # numbers the prompt groups (uid) deterministically, across resumes
        self.stages = self.build_stages()

    def state_dict(self) -> dict:
        """Controller-side state a checkpoint needs for an exact resume."""
        return {"kl_coef": self.kl_ctrl.value, "prompts_seen": self.prompts_seen}

    def load_state_dict(self, state: dict) -> None:
        self.kl_ctrl.value = state["kl_coef"]
        self.prompts_seen = state["prompts_seen"]

    def tag_groups(self, prompts: Batch) -> Batch:
        """Give each prompt a uid; its n responses share it (the group of group estimators)."""
        start, self.prompts_seen = self.prompts_seen, self.prompts_seen + len(prompts)
        uids = np.array([f"p{i}" for i in range(start, start + len(prompts))], dtype=object)
        return prompts.union(Batch.from_dict(non_tensors={"uid": uids}))

    # ---------------------------------------------------------------- the loop
    # The step's stages in order. A recipe inserts one with ``stage_order = PPOTrainer.insert_stage(...)``
    # (or replaces the tuple); optional stages drop out at start-up when the config does not need them.
    stage_order: tuple[str, ...] = (
        "generate", "reward", "filter_groups", "old_log_probs", "reference", "values", "advantages",
        "update_critic", "update_actor", "sync_weights",
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
        skip_old = cfg.actor.ppo_epochs == 1 and plan.mini_batches_per_step == 1
        wanted = {
            "filter_groups": cfg.algorithm.dynamic_sampling.enable,
            "old_log_probs": not skip_old,
            "reference": plan.needs_ref,
            "values": plan.needs_critic,
            "update_critic": plan.needs_critic,
        }
        return wanted.get(name, True)

    def build_stages(self) -> list[str]:
        """The step's stages in order: ``stage_order`` without the optional ones this config does not need."""
        missing = [name for name in self.stage_order if not callable(getattr(self, name, None))]
        if missing:
            raise TypeError(f"{type(self).__name__}.stage_order names stages with no method: {', '.join(missing)}")
        return [name for name in self.stage_order if self.stage_enabled(name)]

    def train_step(self) -> dict[str, float]:
        metrics: dict[str, float] = {}
        start = time.perf_counter()
        batch = None
        for name in self.stages:
            with timed(metrics, name):
                batch = getattr(self, name)(batch, metrics)
        metrics.update(data_metrics(batch, self.cfg.data.max_response_length))
        metrics["timing/step_s"] = time.perf_counter() - start
        tokens = float(batch.tensors["attention_mask"].sum())
        metrics["perf/tokens_per_s"] = tokens / metrics["timing/step_s"]
        return metrics

    def fit(self) -> dict[str, float]:
        """Train for ``trainer.total_steps`` (from the resumed step), validating and saving on schedule."""
        cfg, c = self.cfg, self.c
        wall = time.perf_counter()
        self.step = c.checkpoints.maybe_resume(self)
        initial = self.validate() if self.step == 0 else {}
        if initial:
            c.tracker.log(initial, self.step)
        last_val = initial
        while self.step < cfg.trainer.total_steps:
            self.step += 1
            metrics = self.train_step()
            if cfg.trainer.test_freq > 0 and self.step % cfg.trainer.test_freq == 0 or self.step == cfg.trainer.total_steps:
                last_val = self.validate()
                metrics.update(last_val)
            if cfg.trainer.save_freq > 0 and self.step % cfg.trainer.save_freq == 0 or self.step == cfg.trainer.total_steps:
                c.checkpoints.save(self)
            c.tracker.log(metrics, self.step)
        summary = self.summary(initial, last_val, time.perf_counter() - wall)
        return summary

    def summary(self, initial: dict, final: dict, wall_time_s: float) -> dict:
        out_dir = Path(self.cfg.trainer.output_dir)
        summary = {
            "initial_val_accuracy": initial.get("val/accuracy"),
            "final_val_accuracy": final.get("val/accuracy"),
            "steps": self.step,
            "wall_time_s": wall_time_s,
            "output_dir": str(out_dir.resolve()),
            "hf_export": str((out_dir / "hf_export").resolve()),
            "final_val": final,
        }
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    # ---------------------------------------------------------------- stages
    def next_prompts(self, num_prompts: int) -> Batch:
        prompts = self.tag_groups(self.c.train_prompts(num_prompts))
        prompts.meta.update(step=self.step, temperature=self.cfg.rollout.temperature)
        return prompts

    def generate(self, batch: Batch | None, metrics: dict) -> Batch:
        prompts = self.next_prompts(self.cfg.data.train_batch_size_prompts)
        return self._rollout(prompts)

    def _rollout(self, prompts: Batch) -> Batch:
        out = self.c.actor.generate_sequences(prompts.repeat(self.cfg.rollout.n, interleave=True))
        if getattr(self.estimator, "needs_baseline", False):  # ReMax: the greedy response's score
            greedy = Batch.from_dict(prompts.tensors.to_dict(), prompts.non_tensors, {**prompts.meta, "temperature": 0.0})
            scored = self.reward(self.c.actor.generate_sequences(greedy), {})
            baseline = scored.tensors["token_level_scores"].sum(-1).repeat_interleave(self.cfg.rollout.n)
            out = out.union(Batch.from_dict({"baseline_scores": baseline}))
        out.meta.update(prompts.meta, temperature=out.meta["temperature"])
        return out

    def reward(self, batch: Batch, metrics: dict) -> Batch:
        scores, reward_metrics = self.c.score(batch)
        metrics.update(reward_metrics)
        token_scores = token_level_scores(scores, batch.tensors["response_mask"])
        return batch.union(Batch.from_dict({"token_level_scores": token_scores}))

    def filter_groups(self, batch: Batch, metrics: dict) -> Batch:
        """DAPO dynamic sampling (2503.14476, Sec. 3.2): keep groups whose scores differ; sample more
        prompts until ``data.train_batch_size_prompts`` groups are kept or ``max_gen_batches`` rounds."""
        n, want = self.cfg.rollout.n, self.cfg.data.train_batch_size_prompts
        kept: list[Batch] = []
        rounds = 0
        while True:
            rounds += 1
            scores = batch.tensors["token_level_scores"].sum(-1).view(-1, n)
            varied = (scores.max(-1).values > scores.min(-1).values).repeat_interleave(n)
            if rounds == 1:
                metrics["batch/real_batch_size_ratio"] = float(varied.float().mean())
            kept.append(batch[varied])
            have = sum(len(b) for b in kept) // n
            if have >= want or rounds >= self.cfg.algorithm.dynamic_sampling.max_gen_batches:
                break
            batch = self.reward(self._rollout(self.next_prompts(want)), {})
        merged = Batch.concat(kept) if have > 0 else batch
        metrics["batch/gen_rounds"] = rounds
        if have < want:  # not enough varied groups: fill with the last round's groups rather than stall
            merged = Batch.concat([merged, batch])
        return merged[torch.arange(want * n)]

    def old_log_probs(self, batch: Batch, metrics: dict) -> Batch:
        return batch.union(self.c.actor.compute_log_probs(batch).select(["old_log_probs"]))

    def reference(self, batch: Batch, metrics: dict) -> Batch:
        group = self.c.ref if self.c.ref is not None else self.c.actor
        return batch.union(group.compute_ref_log_probs(batch))

    def values(self, batch: Batch, metrics: dict) -> Batch:
        return batch.union(self.c.critic.compute_values(batch))

    def advantages(self, batch: Batch, metrics: dict) -> Batch:
        cfg, t = self.cfg.algorithm, batch.tensors
        rewards = t["token_level_scores"]
        if cfg.use_kl_in_reward:
            policy = t["old_log_probs"] if "old_log_probs" in t.keys() else t["rollout_log_probs"]
            kl = kl_penalty(cfg.kl_penalty, KLInput(policy, t["ref_log_probs"])) * t["response_mask"]
            rewards = kl_penalized_rewards(rewards, kl, t["response_mask"], self.kl_ctrl.value)
            mean_kl = float((kl.sum(-1) / t["response_mask"].sum(-1).clamp(min=1)).mean())
            metrics.update({"actor/reward_kl": mean_kl, "actor/kl_coef": self.kl_ctrl.value})
            self.kl_ctrl.update(mean_kl, len(batch))
        _, group_ids = np.unique(batch.non_tensors["uid"].astype(str), return_inverse=True)
        out = self.estimator(
            AdvantageInput(
                token_level_rewards=rewards,
                response_mask=t["response_mask"],
                group_ids=torch.as_tensor(group_ids, dtype=torch.long),
                values=t["values"] if "values" in t.keys() else None,
                baseline_scores=t["baseline_scores"] if "baseline_scores" in t.keys() else None,
                options=AdvantageOptions(gamma=cfg.gamma, lam=cfg.lam, epsilon=cfg.norm_adv_epsilon,
                                         scale=cfg.norm_adv_scale),
            )
        )
        if out.zero_variance is not None and "batch/real_batch_size_ratio" not in metrics:
            metrics["batch/real_batch_size_ratio"] = 1.0 - float(out.zero_variance.float().mean())
        fields = {"token_level_rewards": rewards, "advantages": out.advantages, "returns": out.returns}
        return batch.union(Batch.from_dict(fields))

    def update_critic(self, batch: Batch, metrics: dict) -> Batch:
        metrics.update(self.c.critic.update_critic(batch)[0])
        return batch

    def update_actor(self, batch: Batch, metrics: dict) -> Batch:
        actor_metrics = self.c.actor.update_actor(batch)[0]
        metrics.update({k if "/" in k else f"actor/{k}": v for k, v in actor_metrics.items()})
        return batch

    def sync_weights(self, batch: Batch, metrics: dict) -> Batch:
        self.c.actor.sync_weights()
        return batch

    # ---------------------------------------------------------------- validation
    def validate(self) -> dict[str, float]:
        """Generate for every validation prompt (``rollout.val_n`` samples at ``rollout.val_temperature``)."""
        start = time.perf_counter()
        sources, pids, answers, scores = [], [], [], []
        for prompts in self.c.val_prompts():
            pid = np.array([f"v{len(pids) + i}" for i in range(len(prompts))], dtype=object)
            prompts = prompts.union(Batch.from_dict(non_tensors={"uid": pid}))
            prompts.meta.update(step=self.step, temperature=self.cfg.rollout.val_temperature, validation=True)
            out = self.c.actor.generate_sequences(prompts.repeat(self.cfg.rollout.val_n, interleave=True))
            batch_scores, _ = self.c.score(out, validation=True)
            sources += list(out.non_tensors["data_source"])
            pids += list(out.non_tensors["uid"])
            answers += self.c.decode(out)
            scores += batch_scores.tolist()
        metrics = validation_metrics(sources, pids, answers, scores)
        metrics["timing/validate_s"] = time.perf_counter() - start
        print(f"[validate step {self.step}] accuracy={metrics['val/accuracy']:.3f} on {len(scores)} responses",
              flush=True)
        return metrics
