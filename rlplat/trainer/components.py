"""What the trainer works with, built once from the config: worker groups, data, rewards, logging.

:func:`build_components` starts the worker groups (on Ray, or in-process for
``trainer.ray_address=inprocess``), loads the datasets and builds the reward managers; the trainer only
calls the small methods below, so a test or recipe can swap any part. Ray workers start before the data
is read (their processes take seconds to import torch) and load the model after it has been checked.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from rlplat.config.imports import import_user_modules
from rlplat.config.plan import RunPlan
from rlplat.controller import InProcessWorkerGroup, RayWorkerGroup, ResourcePool, WorkerGroup
from rlplat.data import DataError, PromptSampler, RLDataset, collate, resolve_files
from rlplat.data.mixture import MixtureSampler, draws_per_epoch
from rlplat.models.embedded import EMBEDDED
from rlplat.models.vision import image_inputs_of
from rlplat.protocol import Batch
from rlplat.reward import RewardManager, ScoreReport, build_reward_manager
from rlplat.reward.batch import ModelScorers, TrainingScores, score_batch, training_scores
from rlplat.reward.errors import RewardConfigError
from rlplat.reward.judge import ServerJudge
from rlplat.trainer.preflight import checked_teacher
from rlplat.trainer.sft import ensure_embedded_model
from rlplat.trainer.weight_push import WeightPush
from rlplat.utils.tracking import Tracker
from rlplat.rollout.agent_loop import prompt_tools
from rlplat.workers.reward_model import JudgeWorker, RewardModelWorker
from rlplat.workers.roles import ActorRolloutRefWorker, CriticWorker, RefWorker, RolloutWorker, TeacherWorker


@dataclass
class Components:
    cfg: DictConfig
    plan: RunPlan
    tokenizer: Any
    actor: WorkerGroup
    ref: WorkerGroup | None
    critic: WorkerGroup | None
    train_data: RLDataset
    val_data: RLDataset
    sampler: PromptSampler
    reward_train: RewardManager
    reward_val: RewardManager
    tracker: Tracker
    model_path: str  # the resolved model directory (what the hf_export copies its config from)
    pools: list[ResourcePool] = field(default_factory=list)
    reward_model: WorkerGroup | None = None  # RewardModelWorker group when reward.model.path is set
    judge: Any = None  # JudgeWorker group (reward.judge.model_path) or ServerJudge (reward.judge.url)
    rollout: WorkerGroup | None = None  # RolloutWorker group on its own pool (rollout.mode=separate)
    weights: WeightPush | None = None  # the weight syncs to a separate rollout pool and to the reference
    teacher: WorkerGroup | None = None  # TeacherWorker group on its own pool (teacher.placement=separate)

    @property
    def generator(self) -> WorkerGroup:
        """The group whose rollout engines generate: the separate rollout pool, else the actor's workers."""
        return self.rollout if self.rollout is not None else self.actor

    def _batch(self, items: list[dict]) -> Batch:
        tensors, lists = collate(items, self.tokenizer.pad_token_id, self.train_data.images)
        return Batch.from_dict(tensors, non_tensors=lists)

    def train_prompts(self, num_prompts: int, queued: Sequence[int | Mapping] = ()) -> Batch:
        """``num_prompts`` training prompts: the ``queued`` ones first (dataset indices, or rows in the
        dataset schema, from ``data.dynamic_prompts_fn``), then the sampler's next. Non-tensor ``index``:
        each prompt's dataset index (-1 for a queued row)."""
        items, index = [], []
        for entry in queued:
            if isinstance(entry, Mapping):
                new = self.train_data.encode_rows([entry], "data.dynamic_prompts_fn")
                items += new
                index += [-1] * len(new)
            else:
                items.append(self.train_data[entry])
                index.append(entry)
        fill = self.sampler.next_batch(num_prompts - len(items)) if len(items) < num_prompts else []
        items += [self.train_data[i] for i in fill]
        batch = self._batch(items)
        return batch.union(Batch.from_dict(non_tensors={"index": np.array(index + fill, dtype=np.int64)}))

    def val_prompts(self) -> Iterator[Batch]:
        size = self.cfg.data.val_batch_size_prompts
        for start in range(0, len(self.val_data), size):
            yield self._batch([self.val_data[i] for i in range(start, min(start + size, len(self.val_data)))])

    def decode(self, batch: Batch) -> list[str]:
        """The generated text of each response (its response part of ``attention_mask``: what was sampled,
        also where ``algorithm.truncated_responses=mask`` cleared the trained tokens); an agent loop's
        ``response_text`` (the last assistant message) where the rollout gave one."""
        if "response_text" in batch.non_tensors:
            return [str(text) for text in batch.non_tensors["response_text"]]
        t = batch.tensors
        generated = t["attention_mask"][:, -t["responses"].shape[1]:].bool().tolist()
        # plain lists and one batch_decode: faster than indexing and decoding tensor rows one by one
        ids = [[token for token, keep in zip(row, mask) if keep]
               for row, mask in zip(t["responses"].tolist(), generated)]
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)

    @property
    def reference(self) -> WorkerGroup | None:
        """The group that computes the reference log-probs (:attr:`RunPlan.reference`): the actor's workers
        when the reference is colocated (or the actor's base model: LoRA), its own group when separate, None
        without a reference."""
        return {"colocated": self.actor, "adapters": self.actor, "separate": self.ref}.get(self.plan.reference)

    @property
    def teacher_workers(self) -> WorkerGroup | None:
        """The group that computes on-policy distillation's teacher log-probs (:attr:`RunPlan.teacher`): the actor's
        workers when the teacher is colocated, its own group when separate, None without a teacher."""
        return {"colocated": self.actor, "separate": self.teacher}.get(self.plan.teacher)

    def checkpointed(self) -> list[WorkerGroup]:
        """The groups a checkpoint saves: the actor (with a colocated reference once it is synced), the
        critic, and a separate reference when ``ref.sync_steps`` makes it change."""
        synced_ref = self.ref if self.cfg.ref.sync_steps > 0 else None
        return [group for group in (self.actor, self.critic, synced_ref) if group is not None]

    def truncated(self, batch: Batch) -> torch.Tensor:
        """``[batch]`` bool: the responses that ended at ``data.max_response_length`` without EOS or any
        ``rollout.stop_token_ids`` token (a response stops only at one of those, or at the limit)."""
        eos = [] if self.cfg.rollout.ignore_eos else [self.tokenizer.eos_token_id]
        stop = torch.tensor([*eos, *self.cfg.rollout.stop_token_ids], dtype=torch.long)
        return ~torch.isin(batch.tensors["responses"], stop).any(-1)

    @property
    def model_scorers(self) -> ModelScorers:
        """The model-based rewards' scorers as plain callables over the reward model's and the judge's workers
        (or the judge's server)."""
        reward_model, judge = self.reward_model, self.judge

        def logits(prompts: list, texts: list[str]) -> list[float]:
            rows = Batch.from_dict(non_tensors={"raw_prompt": prompts, "response_text": texts})
            return reward_model.score(rows).tensors["rm_scores"].tolist()

        def judged(asks: list[str]) -> list:
            rows = Batch.from_dict(non_tensors={"judge_prompt": np.array(asks, dtype=object)})
            return list(judge.judge(rows).non_tensors["judge_output"])

        answers = judge.answers if isinstance(judge, ServerJudge) else judged if judge is not None else None
        return ModelScorers(logits if reward_model is not None else None, answers)

    def score(self, batch: Batch, validation: bool = False) -> ScoreReport:
        """Score a generated batch with the training (or validation) reward: :func:`rlplat.reward.batch.score_batch`,
        which stops the run when too many of its reward calls failed."""
        manager = self.reward_val if validation else self.reward_train
        return score_batch(manager, batch, self.decode(batch), self.cfg.reward, self.model_scorers, validation)

    def training_scores(self, batch: Batch) -> TrainingScores:
        """A training batch's :class:`~rlplat.reward.batch.TrainingScores` (:meth:`score`, as tensors with their
        reward terms and metrics)."""
        return training_scores(self.reward_train, self.score(batch))

    def shutdown(self) -> None:
        groups = (self.judge if isinstance(self.judge, WorkerGroup) else None, self.reward_model, self.rollout,
                  self.critic, self.teacher, self.ref, self.actor)
        for group in groups:  # the actor's group last: it owns an in-process process group
            if group is not None:
                group.shutdown()
        for pool in self.pools:
            pool.release()
        self.tracker.close()
        self.reward_train.close()
        self.reward_val.close()


def _in_process_groups(cfg: DictConfig, plan: RunPlan):
    """The worker groups in this process: actor+rollout(+ref), the critic and the reward model if needed."""
    kwargs = {"cfg": cfg, "plan": plan}
    actor = InProcessWorkerGroup(ActorRolloutRefWorker, plan.device, **kwargs)
    # One process holds one torch.distributed group: the in-process critic joins the actor's.
    critic = InProcessWorkerGroup(CriticWorker, plan.device, **kwargs) if plan.needs_critic else None
    reward_model = InProcessWorkerGroup(RewardModelWorker, plan.device, **kwargs) if cfg.reward.model.path else None
    judge = InProcessWorkerGroup(JudgeWorker, plan.device, **kwargs) if cfg.reward.judge.model_path else None
    return actor, None, None, critic, None, (reward_model, judge), []


def _launch_ray_groups(cfg: DictConfig, plan: RunPlan):
    """The Ray worker groups: colocated actor+rollout(+ref, +teacher), then optional critic, separate ref, separate
    teacher, separate rollout workers (``rollout.mode=separate``), and reward model and judge (on the actor's pool,
    or their own: ``reward.model.placement``, ``reward.judge.placement``). Nothing here waits for the workers: their
    processes start (and import torch) while the controller reads the data; the models are loaded by
    :func:`_load_models` afterwards."""
    kwargs = {"cfg": cfg, "plan": plan, "imports": import_user_modules(cfg.trainer.imports)}
    # a separate rollout pool computes at the same time as the training workers: on CPU they split the cores
    computing = cfg.trainer.workers_per_node + (cfg.rollout.workers_per_node if cfg.rollout.mode == "separate" else 0)
    pool = ResourcePool(cfg.trainer.nnodes, cfg.trainer.workers_per_node, plan.device, cores_shared_by=computing).create()
    pools = [pool]
    scorers = [(RewardModelWorker, cfg.reward.model) if cfg.reward.model.path else None,
               (JudgeWorker, cfg.reward.judge) if cfg.reward.judge.model_path else None]
    colocated = [s for s in scorers if s is not None and s[1].placement == "colocated"]
    share = 1.0 / (1 + plan.needs_critic + len(colocated))  # the groups on the actor's pool split its bundles
    actor = RayWorkerGroup(ActorRolloutRefWorker, pool, share=share, **kwargs)
    critic = RayWorkerGroup(CriticWorker, pool, share=share, **kwargs) if plan.needs_critic else None
    ref = None
    if plan.reference == "separate":
        ref_pool = ResourcePool(1, cfg.ref.workers_per_node, plan.device, section="ref").create()
        pools.append(ref_pool)
        ref = RayWorkerGroup(RefWorker, ref_pool, **kwargs)
    teacher = None
    if plan.teacher == "separate":
        teacher_pool = ResourcePool(1, cfg.teacher.workers_per_node, plan.device, section="teacher").create()
        pools.append(teacher_pool)
        teacher = RayWorkerGroup(TeacherWorker, teacher_pool, **kwargs)
    rollout = None
    if cfg.rollout.mode == "separate":
        rollout_pool = ResourcePool(cfg.rollout.nnodes, cfg.rollout.workers_per_node, plan.device,
                                    cores_shared_by=computing, section="rollout").create()
        pools.append(rollout_pool)
        rollout = RayWorkerGroup(RolloutWorker, rollout_pool, **kwargs)
    model_groups = []
    for scorer in scorers:
        if scorer is None:
            model_groups.append(None)
        elif scorer in colocated:
            model_groups.append(RayWorkerGroup(scorer[0], pool, share=share, **kwargs))
        else:
            section = "reward.model" if scorer[0] is RewardModelWorker else "reward.judge"
            own = ResourcePool(1, scorer[1].workers_per_node, plan.device, section=section).create()
            pools.append(own)
            model_groups.append(RayWorkerGroup(scorer[0], own, **kwargs))
    return actor, ref, teacher, critic, rollout, tuple(model_groups), pools


def _load_models(cfg: DictConfig, plan: RunPlan, model_path: str, teacher_path: str | None, actor, ref, teacher,
                 critic, rollout, scorers) -> None:
    """Each group loads its model (in-process or Ray), once the data has been checked."""
    actor.init_model(model_path, with_ref=plan.reference == "colocated", with_rollout=rollout is None,
                     teacher_path=teacher_path if plan.teacher == "colocated" else None)
    for group in (critic, ref, rollout):
        if group is not None:
            group.init_model(model_path)
    if teacher is not None:
        teacher.init_model(teacher_path)
    for group in scorers:  # the reward model and the judge: their own model paths
        if group is not None:
            group.init_model()


def prompt_sampler(plan: RunPlan, train_data: RLDataset, data: DictConfig) -> PromptSampler:
    """The order of the train prompts: epoch after epoch, or a mixture's rows per file and epoch
    (``data.train_files`` with numbers: :mod:`rlplat.data.mixture`)."""
    if all(kind == "all" for _, kind, _ in plan.train_mixture):
        return PromptSampler(len(train_data), data.train_batch_size_prompts, shuffle=data.shuffle, seed=data.seed)
    sizes = train_data.rows_per_file()
    if empty := [path for path, size in zip(train_data.files, sizes) if size == 0]:
        raise DataError(f"data.train_files: {empty[0]} has no usable prompt, so the mixture cannot draw from it")
    draws = draws_per_epoch(plan.train_mixture, sizes)
    shares = ", ".join(f"{path} {n} ({n / sum(draws):.0%})" for path, n in zip(train_data.files, draws))
    print(f"[rlplat.data] mixture: {sum(draws)} prompts per epoch: {shares}", flush=True)
    return MixtureSampler(sizes, draws, data.train_batch_size_prompts, seed=data.seed)


def build_components(cfg: DictConfig, plan: RunPlan, model_path: str) -> Components:
    in_process = cfg.trainer.ray_address == "inprocess"
    if cfg.reward.judge.model_path == EMBEDDED:  # the judge workers load it; build it here once if needed
        ensure_embedded_model()
    launched = None if in_process else _launch_ray_groups(cfg, plan)
    from rlplat.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(cfg.model, model_path)
    teacher_path = checked_teacher(cfg, plan, tokenizer)
    data = cfg.data
    images = image_inputs_of(model_path, tokenizer, data, cfg.model.trust_remote_code)  # a VLM's (else None)

    def dataset(files: tuple[str, ...], split: str) -> RLDataset:
        return RLDataset(resolve_files(list(files), split), tokenizer, data.max_prompt_length, data.truncation,
                         data.apply_chat_template, prompt_tools(cfg.rollout.agent), images)

    train_data, val_data = dataset(plan.train_files, "train"), dataset(plan.val_files, "test")
    sampler = prompt_sampler(plan, train_data, data)
    overlong = cfg.algorithm.overlong_buffer
    reward_train = build_reward_manager(cfg.reward, overlong, data.max_response_length)
    try:  # prompt-only rows (no ground truth) need reward functions that need none
        reward_train.check_answers({split: data.without_ground_truth()
                                    for split, data in (("train", train_data), ("test", val_data))})
    except RewardConfigError:
        reward_train.close()  # its worker process
        raise
    reward_val = reward_train.for_validation()
    mode = cfg.trainer.resume_mode  # will the trainer resume? (it verifies the checkpoint then)
    resuming = mode != "disable" and (mode != "auto"
                                      or any((Path(cfg.trainer.output_dir) / "checkpoints").glob("step_*")))
    tracker = Tracker(cfg.trainer.logger, cfg.trainer.output_dir, OmegaConf.to_container(cfg),
                      project=cfg.trainer.project_name, run_name=cfg.trainer.experiment_name, resume=resuming)
    actor, ref, teacher, critic, rollout, scorers, pools = _in_process_groups(cfg, plan) if in_process else launched
    _load_models(cfg, plan, model_path, teacher_path, actor, ref, teacher, critic, rollout, scorers)
    weights = WeightPush(cfg, plan, actor, rollout, ref, val_data.probe_ids())
    weights.open_channels()
    reward_model, judge = scorers
    if cfg.reward.judge.url:
        judge = ServerJudge(cfg.reward.judge)
    return Components(
        cfg=cfg, plan=plan, tokenizer=tokenizer, actor=actor, ref=ref, critic=critic, train_data=train_data,
        val_data=val_data, sampler=sampler, reward_train=reward_train, reward_val=reward_val, tracker=tracker,
        model_path=model_path, pools=pools, reward_model=reward_model, judge=judge, rollout=rollout, weights=weights,
        teacher=teacher,
    )
