"""The role workers. One class per role; roles that share a device are composed in one worker.

* :class:`ActorRolloutRefWorker`: a training engine (the actor), a rollout engine and, when the
  reference policy is colocated, a frozen reference engine, all on one device.
* :class:`RolloutWorker`: a rollout engine alone, for ``rollout.mode=separate`` (its own pool).
* :class:`RefWorker`: the reference policy alone, for ``ref.placement=separate`` (its own pool).
* :class:`TeacherWorker`: on-policy distillation's teacher alone, for ``teacher.placement=separate``.
* :class:`CriticWorker`: the value model for PPO.
* :class:`SFTWorker`: the training engine alone, for supervised fine-tuning (the embedded warm start).

Methods the controller calls carry their dispatch mode (``@register``); see
:mod:`rlplat.workers.base`.
"""

from __future__ import annotations

import contextlib
import threading
import time

import torch
from omegaconf import DictConfig

from rlplat.algorithms import LossDenominators
from rlplat.config.plan import RunPlan
from rlplat.engines import MicroBatching, ParallelLayout, TrainingEngine
from rlplat.engines.routing import OLD_ROUTING
from rlplat.models.hf_files import save_hf_model
from rlplat.protocol import Batch
from rlplat.rollout import SamplingParams
from rlplat.rollout.agent_loop import AgentLoop
from rlplat.rollout.base import NonFiniteLogitsError, RolloutEngine, UpdateSlot, assemble_rollout
from rlplat.utils.errors import RunError
from rlplat.workers.actor_loss import actor_loss, critic_loss, sft_loss
from rlplat.workers.base import Dispatch, Worker, register
from rlplat.workers.engine_setup import build_agent_loop, build_rollout_engine, build_training_engine
from rlplat.workers.weight_channel import BucketLayout
from rlplat.workers.weight_sync import WeightSync, WeightUpdate, probe_mismatch, weight_mismatch


def frozen_log_probs(engine: TrainingEngine, batch: Batch, cfg: DictConfig, role: str) -> Batch:
    """``<role>_log_probs`` ``[B, R]``: a frozen policy's (the reference's, the teacher's) log-probs of the sampled
    tokens, at the temperature the actor's are taken at, in the micro-batches of its section's
    ``log_prob_micro_batch_*`` keys."""
    section = cfg[role]
    split = MicroBatching(section.log_prob_micro_batch_size_seqs_per_worker,
                          section.log_prob_micro_batch_max_tokens_per_worker)
    log_probs = engine.infer(batch, split=split, temperature=batch.meta["temperature"])["log_probs"]
    return Batch.from_dict({f"{role}_log_probs": log_probs})


class _Role(Worker):
    """Shared by the roles: the run's config and plan, the mini-/micro-batch training loop with global loss
    denominators, and the Hugging Face export of a trained engine."""

    trains = ""  # the attribute holding the engine this role trains and checkpoints ("actor", "critic")

    def __init__(self, rank: int, world_size: int, device: str, cfg: DictConfig, plan: RunPlan | None = None):
        super().__init__(rank, world_size, device)
        self.cfg, self.plan = cfg, plan
        self.weights = WeightSync(cfg, plan) if plan is not None else None  # this worker's end of weight sync

    def _train(self, engine: TrainingEngine, batch: Batch, epochs: int, mini_size: int, split: MicroBatching,
               loss_fn, **forward) -> dict[str, float]:
        """``epochs`` passes of mini-batches of ``mini_size`` rows (this worker's share), each split by the
        engine into micro-batches (``split``); one optimizer step per mini-batch. ``loss_fn(fwd, micro,
        denominators)`` gets the mini-batch's global token and sequence counts. Returns mean metrics."""
        totals: dict[str, float] = {}
        steps = 0
        # one permutation per replica: its tensor-parallel ranks must see the same rows in the same order
        replica = engine.layout.dp_rank
        gen = torch.Generator().manual_seed(self.cfg.trainer.seed + batch.meta.get("step", 0) + replica)
        for _ in range(epochs):
            data = batch[torch.randperm(len(batch), generator=gen)] if self.cfg.actor.shuffle else batch
            for mini in data.split(mini_size):
                local = LossDenominators.from_mask(mini.tensors["response_mask"])
                denominators = LossDenominators(*engine.all_reduce_dp([local.num_tokens, local.num_seqs]))
                metrics = engine.train_mini_batch(mini, lambda fwd, micro: loss_fn(fwd, micro, denominators),
                                                  split=split, **forward)
                for k, v in metrics.items():
                    totals[k] = totals.get(k, 0.0) + v
                steps += 1
        return {k: v / steps for k, v in totals.items()}

    def _mini_batch_rows(self, batch: Batch) -> int:
        """This replica's rows per mini-batch: its share of the step, over the step's mini-batches (a
        replica may span several workers, so this is not the step over the world size)."""
        rows, mini_batches = len(batch), self.plan.mini_batches_per_step
        if rows % mini_batches:
            raise ValueError(f"{rows} rows do not split into {mini_batches} mini-batches")
        return rows // mini_batches

    @register(Dispatch.ONE_TO_ALL)
    def parallel_layout(self) -> ParallelLayout:
        """Where this worker sits among the replicas of the engine it trains (read by the worker group
        to split batches by data-parallel rank)."""
        engine = getattr(self, self.trains, None)
        return engine.layout if engine is not None else super().parallel_layout()

    def _checkpointed(self) -> list[str]:
        """The engines a checkpoint holds: the trained one, and the reference once it is synced from the
        actor (``ref.sync_steps``), since it then differs from the initial model."""
        names = [self.trains] if self.trains else []
        if self.cfg.ref.sync_steps > 0 and getattr(self, "ref", None) is not None:
            names.append("ref")
        return names

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Write each checkpointed engine's sharded state under ``path/<engine>`` (collective)."""
        for name in self._checkpointed():
            getattr(self, name).save_checkpoint(f"{path}/{name}")

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        for name in self._checkpointed():
            getattr(self, name).load_checkpoint(f"{path}/{name}")

    @register(Dispatch.ONE_TO_ALL)
    def join_weight_channel(self, to: str, host: str, port: int, size: int) -> None:
        """Join the weight channel from the actor's rank 0 to this worker's pool (``to``: "rollout", "ref") as
        its receiver ``1 + rank`` (:class:`~rlplat.workers.weight_sync.WeightSync`)."""
        self.weights.join(to, host, port, 1 + self.rank, size, self.device_type)

    def close(self) -> None:
        for name in ("actor", "ref", "critic"):
            if (engine := getattr(self, name, None)) is not None:
                engine.close()

    def _export_hf(self, engine: TrainingEngine, path: str, model_path: str) -> None:
        """Every rank streams the weights out (collective); rank 0 writes each bucket as it comes
        (:func:`rlplat.models.hf_files.save_hf_model`), never holding the whole model."""
        buckets = engine.export_weights(bucket_bytes=self.cfg.rollout.weight_sync_bucket_mb * 2**20)
        try:
            if self.rank == 0:
                save_hf_model(buckets, path, model_path, self.cfg.model)
        finally:
            for _ in buckets:  # the other ranks' share of the collective (and rank 0's rest after an error)
                pass


class _Generates(_Role):
    """A role with a rollout engine (``self.rollout``) and the agent loop that drives it (``self.agent``)."""

    rollout: RolloutEngine | None
    agent: AgentLoop | None

    def rollout_mode(self) -> contextlib.AbstractContextManager[dict]:
        """Around each generation: makes the engine ready; yields a dict that receives ``weight_sync_s``."""
        return contextlib.nullcontext({"weight_sync_s": 0.0})

    @register(Dispatch.DP_SPLIT)
    def generate_sequences(self, prompts: Batch) -> Batch:
        """Sample responses; ``prompts.meta`` may carry ``temperature``/``top_p``/``top_k`` (validation).

        Validation samples with a fixed seed per rank, so it never changes the training run's randomness
        (a resumed run and an uninterrupted one stay identical whatever the validation schedule)."""
        r = self.cfg.rollout
        validation = bool(prompts.meta.get("validation"))
        params = SamplingParams(
            max_new_tokens=self.cfg.data.max_response_length,
            temperature=prompts.meta.get("temperature", r.temperature),
            top_p=prompts.meta.get("top_p", r.top_p),
            top_k=prompts.meta.get("top_k", r.top_k),
            stop_token_ids=tuple(r.stop_token_ids),
            ignore_eos=r.ignore_eos and not validation,
            seed=self.cfg.trainer.seed + 7919 * (1 + self.rank) if validation else None,
        )
        with self.rollout_mode() as timings:
            try:
                out = self.agent.run(self.rollout, prompts, params)
            except NonFiniteLogitsError as err:
                step = prompts.meta.get("step", "?")
                what = f"validation at step {step}" if validation else f"step {step}"
                raise RunError(f"{what}: the rollout engine ({r.name}) found NaN/inf logits ({err}): the policy's "
                               f"weights or activations are not finite (a diverged update, or a float16 overflow); "
                               f"check model.path, lower actor.optim.lr, or resume from the last checkpoint") from None
        out.meta["temperature"] = params.temperature if params.temperature > 0 else 1.0
        out.meta.update(timings)  # weight_sync_s, weight_sync_mb
        return out

    def close(self) -> None:
        if self.rollout is not None:
            self.rollout.close()
        super().close()


class ActorRolloutRefWorker(_Generates):
    """Actor (trained), rollout engine and (colocated) reference policy on one device."""

    trains = "actor"

    def __init__(self, rank: int, world_size: int, device: str, cfg: DictConfig, plan: RunPlan):
        super().__init__(rank, world_size, device, cfg, plan)
        self.actor = self.rollout = self.ref = self.teacher = self.agent = None
        self.weights_stale = False  # the actor changed since the rollout engine last received its weights

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, model_path: str, with_ref: bool, with_rollout: bool = True,
                   teacher_path: str | None = None) -> None:
        """Build the actor, the colocated reference (``with_ref``), the colocated teacher (``teacher_path``) and
        the rollout engine (``with_rollout``; False when the rollout workers have a pool of their own:
        ``rollout.mode=separate``)."""
        from rlplat.models.tokenizer import load_tokenizer

        cfg, ctx = self.cfg, self.dist
        torch.manual_seed(cfg.trainer.seed + self.rank)
        total = cfg.trainer.total_steps * self.plan.mini_batches_per_step * cfg.actor.ppo_epochs
        self.actor = build_training_engine(cfg, "actor", model_path, ctx, cfg.actor.optim, total)
        if with_ref:
            self.ref = build_training_engine(cfg, "ref", model_path, ctx)
        if teacher_path:
            self.teacher = build_training_engine(cfg, "teacher", teacher_path, ctx)
        if self.plan.reference == "adapters" and cfg.ref.sync_steps > 0:
            self.actor.lora.keep_reference()  # the synced reference's adapters; the base weights are shared
        if not with_rollout:
            return
        tokenizer = load_tokenizer(cfg.model, model_path)
        self.rollout = build_rollout_engine(cfg, self.plan, model_path, tokenizer, ctx)
        self.agent = build_agent_loop(cfg, self.plan, tokenizer)
        # the rollout engine read the same model from disk, unless it starts from a dummy initialisation
        self.weights_stale = not self.weights.shares(self.actor, self.rollout) and self.rollout.needs_initial_weights

    @contextlib.contextmanager
    def rollout_mode(self):
        """Wake the engine's weights, send the actor's if they changed since the last rollout, wake the
        KV cache, generate inside the block, then free the engine's memory for training (engines that
        declare they sleep). Yields a dict that receives ``weight_sync_s`` and ``weight_sync_mb``."""
        engine, timings, sleeps = self.rollout, {"weight_sync_s": 0.0, "weight_sync_mb": 0.0}, self.plan.rollout_sleeps
        if sleeps:
            engine.wake_up(("weights",))
        if self.weights_stale or engine.weights_discarded_by_sleep:
            start = time.perf_counter()
            timings["weight_sync_mb"] = self.weights.to_engine(self.actor, engine) / 2**20
            timings["weight_sync_s"] = time.perf_counter() - start
            self.weights_stale = False
        if sleeps:
            engine.wake_up(("kv_cache",))
        try:
            yield timings
        finally:
            if sleeps:
                engine.sleep()

    @register(Dispatch.DP_SPLIT)
    def compute_log_probs(self, batch: Batch, entropy: bool = False) -> Batch:
        """``old_log_probs`` ``[B, R]`` under the current actor (and, for ``actor.moe.router_replay=r2``, the
        routing it took, ``old_routed_experts``), with ``sum_pi_squared`` when the advantage
        estimator reads it and ``entropy`` when asked (the trainer does not: the update reports the entropy
        of the same policy, and at a large vocabulary it costs another pass over each token's logits)."""
        actor = self.cfg.actor
        split = MicroBatching(actor.log_prob_micro_batch_size_seqs_per_worker, actor.micro_batch_max_tokens_per_worker)
        out = self.actor.infer(batch, split=split, temperature=batch.meta["temperature"], need_entropy=entropy,
                               need_sum_pi_squared=self.plan.estimator.needs_sum_pi_squared)
        out["old_log_probs"] = out.pop("log_probs")
        if "routed_experts" in out:  # actor.moe.router_replay=r2: this pass's routing, which the update replays
            out[OLD_ROUTING] = out.pop("routed_experts")
        return Batch.from_dict(out)

    @register(Dispatch.DP_SPLIT)
    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """The colocated reference's log-probs; with LoRA (reference "adapters") the actor's own model without
        its adapters, or with the synced reference's adapters (``ref.sync_steps``): no copy of the model."""
        if self.plan.reference == "adapters":
            with self.actor.lora.reference():
                return frozen_log_probs(self.actor, batch, self.cfg, "ref")
        return frozen_log_probs(self.ref, batch, self.cfg, "ref")

    @register(Dispatch.DP_SPLIT)
    def compute_teacher_log_probs(self, batch: Batch) -> Batch:
        """The colocated teacher's log-probs of the sampled tokens (on-policy distillation)."""
        return frozen_log_probs(self.teacher, batch, self.cfg, "teacher")

    @register(Dispatch.DP_SPLIT_EXACT)
    def update_actor(self, batch: Batch) -> dict[str, float]:
        """PPO-style update over ``actor.ppo_epochs`` x mini-batches; returns mini-batch-mean metrics."""
        cfg = self.cfg

        def loss_fn(fwd, micro: Batch, denominators: LossDenominators):
            return actor_loss(fwd, micro, cfg.algorithm, denominators, self.plan.loss_scale_factor,
                              cfg.actor.entropy_coeff, self.plan.old_policy)

        # the entropy metric is always reported; it gets a gradient only with a coefficient
        self.actor.packing_efficiency()  # count this update's forward passes only
        split = MicroBatching(cfg.actor.micro_batch_size_seqs_per_worker, cfg.actor.micro_batch_max_tokens_per_worker)
        metrics = self._train(self.actor, batch, cfg.actor.ppo_epochs, self._mini_batch_rows(batch), split, loss_fn,
                              temperature=batch.meta["temperature"], need_entropy=True)
        metrics["perf/packing_efficiency"] = self.actor.packing_efficiency()
        self.weights_stale = True  # sent to the rollout engine at the next rollout
        return metrics

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore the actor; the rollout engine receives the restored weights at the next rollout."""
        super().load_checkpoint(path)
        self.weights_stale = True

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str, model_path: str) -> None:
        """Write the actor as a Hugging Face model (safetensors + tokenizer) that from_pretrained loads."""
        self._export_hf(self.actor, path, model_path)

    @register(Dispatch.ONE_TO_ALL)
    def actor_weights(self, dtype: str | None = None, bucket_bytes: int = 512 * 2**20,
                      only_rank0: bool = False) -> dict[str, torch.Tensor] | None:
        """Every rank's view of the full actor weights (CPU copies) as the rollout engine receives them
        (``only_rank0``: the other ranks take part in the gathers and return None)."""
        buckets = self.actor.export_weights(getattr(torch, dtype) if dtype else None, bucket_bytes)
        if only_rank0 and self.rank != 0:
            for _ in buckets:  # the gathers are collective: take part, keep nothing
                pass
            return None
        return {name: tensor.detach().cpu().clone() for bucket in buckets for name, tensor in bucket}

    @register(Dispatch.ONE_TO_ALL)
    def weight_update(self, version: int, verify: bool, probe_ids: list[int] | None = None,
                      probe_tolerance: float = 0.0) -> WeightUpdate | None:
        """The actor's weights as one numbered :class:`WeightUpdate` for a separate rollout pool
        (:meth:`WeightSync.update`); when ``verify``, with each tensor's checksum and the actor's log-probs of
        ``probe_ids``. Rank 0 returns it; the other ranks take part in the gathers (and the probe's forward)."""
        update = self.weights.update(self.actor, self.rank, version, verify)
        if verify and probe_ids:
            log_probs = self._sequence_log_probs(probe_ids)  # a forward every rank takes part in
            if update is not None:
                update.probe_ids, update.probe_log_probs, update.probe_tolerance = list(probe_ids), log_probs, probe_tolerance
        return update

    @register(Dispatch.ONE_TO_ALL)
    def weight_channel_address(self) -> tuple[str, int]:
        """Where a weight channel's store will listen: this node and a free port (rank 0's answer is used)."""
        return self.master_address()

    @register(Dispatch.ONE_TO_ALL)
    def join_weight_channel(self, to: str, host: str, port: int, size: int) -> None:
        """Rank 0 opens the weight channel to the ``size - 1`` workers of the ``to`` pool ("rollout": a separate
        rollout pool with ``rollout.weight_transport=distributed``; "ref": a separate reference) and is its
        sender; the other ranks have no part in it."""
        if self.rank == 0:
            self.weights.join(to, host, port, 0, size, self.device_type)

    def _sequence_log_probs(self, ids: list[int]) -> list[float]:
        """The actor's log-prob of each of ``ids[1:]`` given the tokens before it (temperature 1)."""
        tokens = torch.tensor([ids], dtype=torch.long)
        one = torch.ones(1, len(ids) - 1, dtype=torch.long)
        prompt = Batch.from_dict({"prompts": tokens[:, :1], "prompt_mask": torch.ones(1, 1, dtype=torch.long)})
        batch = assemble_rollout(prompt, tokens[:, 1:], one, torch.zeros(one.shape))
        with self.actor.own_routing():  # no rollout routed the probe: a mixture of experts routes it on its own
            return self.actor.infer(batch, split=MicroBatching(1))["log_probs"][0].tolist()

    @register(Dispatch.ONE_TO_ALL)
    def sync_reference(self, alpha: float) -> None:
        """The colocated reference <- alpha * actor + (1 - alpha) * reference (:meth:`WeightSync.blend_reference`)."""
        self.weights.blend_reference(self.actor, self.ref, alpha)

    @register(Dispatch.ONE_TO_ALL)
    def send_reference(self) -> list[BucketLayout] | None:
        """A separate reference's blend: the actor's weights over the reference's weight channel
        (:meth:`WeightSync.send_reference`); rank 0 returns their layouts."""
        return self.weights.send_reference(self.actor, self.rank)


class RolloutWorker(_Generates):
    """A rollout engine alone, on a pool of its own (``rollout.mode=separate``): it holds no training copy of
    the model and no optimizer, receives the actor's weights as numbered :class:`WeightUpdate` s, and
    tags every sample with the ``policy_version`` that generated it (and, with ``rollout.partial=resume``, the
    ``policy_version_last`` its last token was sampled by)."""

    # rollout.partial=resume receives updates while a generation runs; the heartbeat is answered beside both
    concurrency_groups = {"weights": 1, "heartbeat": 1}
    works_alone = True  # rollout workers never talk to each other: a dead one is replaced alone (rollout.max_restarts)

    def __init__(self, rank: int, world_size: int, device: str, cfg: DictConfig, plan: RunPlan):
        super().__init__(rank, world_size, device, cfg, plan)
        self.rollout = self.agent = None
        # the actor update whose weights the engine holds: -1 = none yet (the controller sends the first, the initial
        # model's or a resumed checkpoint's, before any generation: calls wait for it, see weights_at_least)
        self.version = -1
        self.loaded = threading.Condition()  # notified when ``version`` changes, or a load fails
        self.load_error: str | None = None  # why the last update could not be loaded (calls waiting for it stop)
        self.engine_lock = threading.Lock()  # held while the engine generates, or loads weights between calls

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, model_path: str) -> None:
        from rlplat.models.tokenizer import load_tokenizer

        cfg = self.cfg
        torch.manual_seed(cfg.trainer.seed + self.rank)  # the stream a colocated worker samples from
        tokenizer = load_tokenizer(cfg.model, model_path)
        self.rollout = build_rollout_engine(cfg, self.plan, model_path, tokenizer, self.dist)
        self.agent = build_agent_loop(cfg, self.plan, tokenizer)
        if cfg.rollout.partial == "resume":
            self.rollout.updates = UpdateSlot()

    @register(Dispatch.ONE_TO_ALL)
    def receive_weights(self, update: WeightUpdate) -> str | None:
        """Load ``update`` into the engine (its buckets, or those arriving over the weight channel, one at a
        time) after the calls submitted before it, then make the checks it carries (those the engine can:
        checksums of the tensors it holds, its log-probs of the probe). Returns what differs in one line, or None."""
        if not update.layouts:
            return self._load(update, update.buckets)
        arriving = self.weights.receive(update.layouts, "rollout")
        try:
            return self._load(update, arriving)
        finally:  # an engine that stopped reading still takes the rest: the sender must not wait forever
            for _ in arriving:
                pass

    @register(Dispatch.ONE_TO_ALL, concurrency_group="weights")
    def receive_weights_between_tokens(self, update: WeightUpdate) -> str | None:
        """``rollout.partial=resume``: :meth:`receive_weights` in a thread of its own, beside the generation. The
        update is received whole (held in memory), then loaded by the generation under way between two of its
        tokens (it goes on under the new weights), or as soon as no generation runs."""
        buckets = list(self.weights.receive(update.layouts, "rollout")) if update.layouts else update.buckets
        applied, outcome = threading.Event(), {}

        def apply() -> None:
            try:
                outcome["problem"] = self._load(update, buckets)
            except BaseException as err:  # raised in this thread, not in the generation's
                outcome["error"] = err
            finally:
                applied.set()

        self.rollout.updates.offer(apply)
        while not applied.wait(0.01):
            if self.engine_lock.acquire(blocking=False):  # no generation runs: load it here
                try:
                    if (update_now := self.rollout.updates.take()) is not None:
                        update_now()
                finally:
                    self.engine_lock.release()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["problem"]

    @register(Dispatch.ONE_TO_ALL, concurrency_group="heartbeat")
    def heartbeat(self) -> bool:
        """Answered in a thread of its own: a worker that cannot answer is hung (``rollout.heartbeat_s``)."""
        return True

    def _load(self, update: WeightUpdate, buckets) -> str | None:
        try:
            self.weights.load(self.rollout, buckets)
        except BaseException as err:
            with self.loaded:
                self.load_error = f"loading the weights of update {update.version} failed: {err}"
                self.loaded.notify_all()
            raise
        with self.loaded:
            self.version = update.version
            self.loaded.notify_all()
        held = self.rollout.weight_checksums() if update.checksums else None
        if held is not None and (problem := weight_mismatch(update, held)):
            return problem
        scored = self.rollout.sequence_log_probs(update.probe_ids) if update.probe_ids else None
        return probe_mismatch(update, scored) if scored is not None else None

    @register(Dispatch.DP_SPLIT)
    def generate_sequences(self, prompts: Batch) -> Batch:
        """Also per row: ``policy_version``, and when this worker generated it (``generated_from``,
        ``generated_until``: wall-clock seconds of the call, for the run's timeline). A call whose
        ``meta["weights_at_least"]`` is v starts once the weights of update v are loaded."""
        if (needed := prompts.meta.get("weights_at_least")) is not None:
            self._wait_for_version(needed)
        with self.engine_lock:
            start, version = time.time(), self.version
            out = super().generate_sequences(prompts)
        rows = len(out)
        fields = {"policy_version": torch.full((rows,), version, dtype=torch.long),
                  "generated_from": torch.full((rows,), start, dtype=torch.float64),
                  "generated_until": torch.full((rows,), time.time(), dtype=torch.float64)}
        if "weight_updates" in out.tensors.keys():  # rollout.partial=resume: the updates loaded during the call
            taken = out.pop(["weight_updates_before", "weight_updates"]).tensors
            fields["policy_version"] = version + taken["weight_updates_before"]
            fields["policy_version_last"] = fields["policy_version"] + taken["weight_updates"]
        return out.union(Batch.from_dict(fields))

    def _wait_for_version(self, version: int, timeout_s: float = 1800.0) -> None:
        with self.loaded:
            arrived = self.loaded.wait_for(lambda: self.version >= version or self.load_error, timeout=timeout_s)
            if self.load_error and self.version < version:
                raise RunError(f"rollout worker {self.rank}: {self.load_error}")
            if not arrived:
                held = f"those of update {self.version}" if self.version >= 0 else "none yet"
                raise RunError(f"rollout worker {self.rank}: the weights of update {version} did not arrive within "
                               f"{timeout_s:.0f} s (it holds {held})")


class RefWorker(_Role):
    """The reference policy on its own pool (``ref.placement=separate``)."""

    ref: TrainingEngine

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, model_path: str) -> None:
        self.ref = build_training_engine(self.cfg, "ref", model_path, self.dist)

    @register(Dispatch.DP_SPLIT)
    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        return frozen_log_probs(self.ref, batch, self.cfg, "ref")

    @register(Dispatch.ONE_TO_ALL)
    def blend_reference(self, layouts: list[BucketLayout], alpha: float) -> None:
        """reference <- alpha * actor + (1 - alpha) * reference, from the actor's full weights as they arrive
        over the reference's weight channel (:meth:`ActorRolloutRefWorker.send_reference`), bucket by bucket."""
        arriving = self.weights.receive(layouts, "ref")
        try:
            self.ref.blend_weights(arriving, alpha)
        finally:  # the sender must not wait forever for a receiver that stopped reading
            for _ in arriving:
                pass


class TeacherWorker(_Role):
    """On-policy distillation's teacher on its own pool (``teacher.placement=separate``): frozen, never synced."""

    teacher: TrainingEngine

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, model_path: str) -> None:
        self.teacher = build_training_engine(self.cfg, "teacher", model_path, self.dist)

    @register(Dispatch.DP_SPLIT)
    def compute_teacher_log_probs(self, batch: Batch) -> Batch:
        return frozen_log_probs(self.teacher, batch, self.cfg, "teacher")


class CriticWorker(_Role):
    """Value model (the policy's backbone with a 1-output head) trained with the clipped value loss."""

    trains = "critic"
    critic: TrainingEngine

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, model_path: str) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.trainer.seed + self.rank)  # the value head is freshly initialised
        total = cfg.trainer.total_steps * self.plan.mini_batches_per_step * cfg.critic.ppo_epochs
        self.critic = build_training_engine(cfg, "critic", cfg.critic.model_path or model_path, self.dist,
                                            cfg.critic.optim, total, value_head=True)

    @register(Dispatch.DP_SPLIT)
    def compute_values(self, batch: Batch) -> Batch:
        out = self.critic.infer(batch, split=self._critic_split())
        return Batch.from_dict({"values": out["values"] * batch.tensors["response_mask"]})

    @register(Dispatch.DP_SPLIT_EXACT)
    def update_critic(self, batch: Batch) -> dict[str, float]:
        cfg = self.cfg

        def loss_fn(fwd, micro: Batch, denominators: LossDenominators):
            return critic_loss(fwd, micro, cfg.algorithm, cfg.critic.cliprange_value, denominators, self.plan.loss_scale_factor)

        return self._train(self.critic, batch, cfg.critic.ppo_epochs, self._mini_batch_rows(batch),
                           self._critic_split(), loss_fn)

    def _critic_split(self) -> MicroBatching:
        critic = self.cfg.critic
        return MicroBatching(critic.micro_batch_size_seqs_per_worker, critic.micro_batch_max_tokens_per_worker)


class SFTWorker(_Role):
    """Supervised fine-tuning (the embedded model's warm start): the training engine alone, no rollout
    engine and no reference. Only the ``model``, ``actor`` and ``trainer.seed`` keys of ``cfg`` are read."""

    trains = "actor"
    actor: TrainingEngine

    def __init__(self, rank: int, world_size: int, device: str, cfg: DictConfig, total_steps: int):
        super().__init__(rank, world_size, device, cfg)
        self.total_steps = total_steps

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, model_path: str) -> None:
        torch.manual_seed(self.cfg.trainer.seed + self.rank)
        self.actor = build_training_engine(self.cfg, "actor", model_path, self.dist, self.cfg.actor.optim,
                                           self.total_steps)

    @register(Dispatch.DP_SPLIT_EXACT)
    def update_sft(self, batch: Batch) -> dict[str, float]:
        """One supervised step on teacher-forced responses: token-mean negative log-likelihood."""
        split = MicroBatching(self.cfg.actor.micro_batch_size_seqs_per_worker)
        return self._train(self.actor, batch, 1, len(batch), split, sft_loss)

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str, model_path: str) -> None:
        self._export_hf(self.actor, path, model_path)
