"""The plan's memory estimate of one device in each phase of a step (rollout, log-prob passes, the update, the
critic's update), from the model's shape and what the chosen engines declare about their memory
(``TrainingEngine.memory_layout`` / ``memory_state`` / ``memory_activations`` / ``keeps_gradients`` /
``lends_weights``, ``RolloutEngine.memory``), and the batch ledger the activations follow. The formulas,
their sources and the measured error are in docs/plan.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from omegaconf import DictConfig

from rlplat.config.derive import data_parallel_replicas
from rlplat.engines import TRAINING_ENGINES, TrainingEngine
from rlplat.engines.memory import MemoryLayout
from rlplat.models.shape import ModelShape, lora_params
from rlplat.rollout import ROLLOUT_ENGINES

GB = 10**9
GIB = 2**30


@dataclass
class Phase:
    """One phase's estimate on one device: named parts in bytes."""

    name: str
    parts: dict[str, float] = field(default_factory=dict)
    knob: str = ""  # what to turn when it does not fit

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def fmt(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= 0.1 * GIB else f"{nbytes / 2**20:.1f} MiB"


# ---------------------------------------------------------------------------------------------- the ledger

@dataclass(frozen=True)
class Ledger:
    prompts: int  # per step, global
    sequences: int
    workers: int
    replicas: int  # data-parallel replicas of the actor
    max_prompt: int
    max_response: int
    mini_batches: int
    optimizer_steps: int  # per training step
    micro_batches: int  # per mini-batch and worker
    micro_seqs: int
    micro_tokens: int  # the most tokens one update micro-batch computes
    logprob_micro_tokens: int
    steps_per_epoch: float
    epochs: float

    @property
    def max_tokens(self) -> int:
        return self.sequences * self.length

    @property
    def length(self) -> int:
        """The longest sequence: the longest prompt (after truncation) and a full response."""
        return self.max_prompt + self.max_response

    @property
    def sequences_per_replica(self) -> int:
        return self.sequences // self.replicas


def ledger(cfg: DictConfig, plan, train_rows: int, replicas: int, longest_prompt: int) -> Ledger:
    """The batch ledger; a batch's prompts are padded to its longest, at most ``longest_prompt`` (the data's
    longest after truncation), so the sequence length is that plus the response length
    (``data.max_response_length``, or an agent loop's ``rollout.agent.max_total_tokens``)."""
    data, actor = cfg.data, cfg.actor
    sequences = data.train_batch_size_prompts * cfg.rollout.n
    mini_seqs = actor.mini_batch_size_prompts * cfg.rollout.n // replicas
    micro_seqs = min(actor.micro_batch_size_seqs_per_worker, mini_seqs)
    length = longest_prompt + plan.response_length
    budget = actor.micro_batch_max_tokens_per_worker
    micro_tokens = min(budget, micro_seqs * length) if budget else micro_seqs * length
    micro_batches = math.ceil(mini_seqs * length / budget) if budget else math.ceil(mini_seqs / micro_seqs)
    logprob_seqs = min(actor.log_prob_micro_batch_size_seqs_per_worker, sequences // replicas)
    logprob_tokens = min(budget, logprob_seqs * length) if budget else logprob_seqs * length
    steps_per_epoch = train_rows / data.train_batch_size_prompts
    return Ledger(prompts=data.train_batch_size_prompts, sequences=sequences, workers=plan.world_size,
                  replicas=replicas, max_prompt=longest_prompt, max_response=plan.response_length,
                  mini_batches=plan.mini_batches_per_step, optimizer_steps=plan.mini_batches_per_step * actor.ppo_epochs,
                  micro_batches=micro_batches, micro_seqs=micro_seqs, micro_tokens=micro_tokens,
                  logprob_micro_tokens=logprob_tokens, steps_per_epoch=steps_per_epoch,
                  epochs=cfg.trainer.total_steps / steps_per_epoch)


# ---------------------------------------------------------------------------------------------- memory

def engine_of(cfg: DictConfig, role: str) -> type[TrainingEngine]:
    """``role``'s training engine class (its package need not be installed where the run is planned)."""
    return TRAINING_ENGINES.get(cfg[role].strategy, require_installed=False)


def layout(cfg: DictConfig, role: str, world: int) -> MemoryLayout:
    """How ``role``'s engine splits its model over one of ``world`` workers (its declaration)."""
    section = cfg[role].get(cfg[role].strategy)
    return engine_of(cfg, role).memory_layout(section, world, data_parallel_replicas(cfg, role, world))


def actor_state(shape: ModelShape, lay: MemoryLayout, compute_bytes: int, cfg: DictConfig, trained: bool,
                role: str = "actor") -> dict[str, float]:
    """What one device holds of ``role``'s model (weights; for a trained model gradients and the optimizer's
    state), as its engine declares it."""
    return engine_of(cfg, role).memory_state(shape, cfg, role, lay, compute_bytes, trained)


def activation_bytes(shape: ModelShape, cfg: DictConfig, lay: MemoryLayout, tokens: int, response_tokens: int,
                     compute_bytes: int, grad: bool, seq: int, role: str = "actor") -> dict[str, float]:
    """What a forward pass over ``tokens`` on one worker holds, as ``role``'s engine declares it."""
    return engine_of(cfg, role).memory_activations(shape, cfg, role, lay, tokens, response_tokens, compute_bytes,
                                                   grad, seq)


def rollout_parts(shape: ModelShape, cfg: DictConfig, plan, lent: bool, sequences_per_worker: int, length: int,
                  device_memory: int) -> tuple[dict[str, float], str]:
    """The rollout engine's memory on one device while it generates sequences of up to ``length`` tokens, and
    the knob for it, as the engine declares them; ``lent``: the actor's live weights are whole on the device."""
    name = cfg.rollout.name
    engine = ROLLOUT_ENGINES.get(name, require_installed=False)
    return engine.memory(shape, cfg.rollout.get(name), f"rollout.{name}", plan.rollout_dtype, plan.device,
                         sequences_per_worker, length, device_memory, lent)


def teacher_parts(teacher: ModelShape, cfg: DictConfig, plan, led: Ledger) -> tuple[dict[str, float], dict[str, float]]:
    """On-policy distillation's teacher on one of its devices (an actor's when colocated, a teacher worker's when
    separate): its frozen weights, and what its log-prob pass over one micro-batch holds (``teacher.*`` sizes)."""
    world = plan.world_size if plan.teacher == "colocated" else cfg.teacher.workers_per_node
    lay = layout(cfg, "teacher", world)
    compute = getattr(torch, plan.actor_dtype).itemsize
    weights = actor_state(teacher, lay, compute, cfg, trained=False, role="teacher")
    section = cfg.teacher
    seqs = min(section.log_prob_micro_batch_size_seqs_per_worker,
               -(-led.sequences // data_parallel_replicas(cfg, "teacher", world)))
    budget = section.log_prob_micro_batch_max_tokens_per_worker
    tokens = min(budget, seqs * led.length) if budget else seqs * led.length
    response_tokens = int(tokens * led.max_response / led.length)
    passing = activation_bytes(teacher, cfg, lay, tokens, response_tokens, compute, grad=False, seq=led.length,
                               role="teacher")
    return weights, {f"teacher's {name}": nbytes for name, nbytes in passing.items()}


def phases(shape: ModelShape, cfg: DictConfig, plan, led: Ledger, device_memory: int,
           teacher: ModelShape | None = None) -> list[Phase]:
    """Rollout, log-prob passes and the update, on one actor device; and a separate teacher's pass on one of its
    devices (``teacher``: the teacher's shape when the run distills)."""
    lay = layout(cfg, "actor", plan.world_size)
    actor = engine_of(cfg, "actor")
    compute = getattr(torch, plan.actor_dtype).itemsize
    resident = actor_state(shape, lay, compute, cfg, trained=True)
    grads = next(k for k in resident if "gradients" in k)
    # the gradients exist from the first backward to the optimizer step (FSDP frees them after it; a
    # one-worker float32 module keeps them in one buffer for the whole run)
    keeps_grads = actor.keeps_gradients(cfg, "actor", lay, compute)
    between = {k: v for k, v in resident.items() if k != grads or keeps_grads}
    ref = {}
    if plan.reference == "colocated":
        ref = actor_state(shape, layout(cfg, "ref", plan.world_size), compute, cfg, trained=False, role="ref")
    critic = {}
    if plan.needs_critic:  # the same backbone with a one-output head, trained on the same devices
        critic_state = actor_state(shape, layout(cfg, "critic", plan.world_size), compute, cfg, trained=True,
                                   role="critic")
        critic = {k: v for k, v in critic_state.items() if "gradients" not in k}
    response_share = led.max_response / (led.max_prompt + led.max_response)
    separate = cfg.rollout.mode == "separate"  # the rollout engines have devices of their own
    rollout_workers = cfg.rollout.nnodes * cfg.rollout.workers_per_node
    lent = not separate and actor.lends_weights(cfg, "actor", lay)  # a rollout worker holds no actor weights
    rollout, rollout_knob = rollout_parts(shape, cfg, plan, lent,
                                          -(-led.sequences // rollout_workers) if separate else led.sequences_per_replica,
                                          led.length, device_memory)
    if plan.rollout_sleeps or separate:  # vLLM / SGLang release their memory outside the rollout
        between_rollouts = {}
    else:
        between_rollouts = {k: v for k, v in rollout.items() if not k.startswith("KV cache")}
    logprob = activation_bytes(shape, cfg, lay, led.logprob_micro_tokens,
                               int(led.logprob_micro_tokens * response_share), compute, grad=False, seq=led.length)
    update = activation_bytes(shape, cfg, lay, led.micro_tokens, int(led.micro_tokens * response_share),
                              compute, grad=True, seq=led.length)
    taught, teaching = teacher_parts(teacher, cfg, plan, led) if teacher is not None else ({}, {})
    logprob_knob = "actor.log_prob_micro_batch_size_seqs_per_worker (or a token budget)"
    if plan.teacher == "colocated":  # its weights stay beside the actor's; its pass follows the actor's
        ref = {**ref, **taught}
        if sum(teaching.values()) > sum(logprob.values()):
            logprob, logprob_knob = teaching, logprob_knob.replace("actor.", "teacher.")
    out = [
        Phase("rollout, on each rollout worker's device (rollout.mode=separate)", rollout, rollout_knob) if separate
        else Phase("rollout", {**between, **ref, **critic, **rollout}, rollout_knob),
        Phase("log-prob passes", {**between, **ref, **critic, **between_rollouts, **logprob}, logprob_knob),
        Phase("update", {**resident, **ref, **critic, **between_rollouts, **update}, actor.update_knob),
    ]
    if plan.needs_critic:  # the critic's update: its gradients and activations beside the actor's state
        critic_update = {**between, **ref, **critic_state, **between_rollouts, **update}
        out.append(Phase("critic update", critic_update, "critic.micro_batch_size_seqs_per_worker or "
                                                          "model.gradient_checkpointing=true"))
    return out + teacher_phases(out[1 if separate else 0:], plan, taught, teaching)


def teacher_phases(actor_phases: list[Phase], plan, taught: dict[str, float],
                   teaching: dict[str, float]) -> list[Phase]:
    """A colocated teacher (``taught``: its weights, counted in ``actor_phases``) adds its way out to their knobs;
    a separate one's weights and pass (``teaching``) are a phase of its own, returned."""
    if plan.teacher == "colocated":
        for phase in actor_phases:
            phase.knob += (f"; or teacher.placement=separate (the teacher's {fmt(sum(taught.values()))} on a pool of "
                           f"its own)")
    if plan.teacher != "separate":
        return []
    return [Phase("teacher log-prob pass, on each teacher worker's device (teacher.placement=separate)",
                  {**taught, **teaching}, "teacher.log_prob_micro_batch_size_seqs_per_worker (or a token budget), or "
                                          "more teacher.workers_per_node with a sharding engine")]


def validation_cost(cfg: DictConfig, val_rows: int, length: int) -> dict[str, float]:
    calls = math.ceil(val_rows / cfg.data.val_batch_size_prompts)
    freq, steps = cfg.trainer.test_freq, cfg.trainer.total_steps
    count = 1 + (steps // freq if freq > 0 else 0) + (0 if freq > 0 and steps % freq == 0 else 1)
    return {"prompts": val_rows, "calls": calls, "responses": val_rows * cfg.rollout.val_n, "validations": count,
            "tokens": val_rows * cfg.rollout.val_n * length}


def checkpoint_bytes(shape: ModelShape, cfg: DictConfig, plan) -> dict[str, float]:
    """A checkpoint on disk, as the engines save it: the actor's float32 weights and AdamW's two moments of what
    it trains (a frozen vision tower: weights without moments) or, with LoRA, the adapters and their moments
    alone (the base weights are the model path's) and a synced reference's adapters; a synced reference's
    weights (``ref.sync_steps``); the critic's weights and moments; and the float32 Hugging Face export (with
    LoRA: the merged model)."""
    params, synced = shape.params, cfg.ref.sync_steps > 0
    if cfg.model.lora.rank:
        adapters = lora_params(shape, cfg.model.lora)
        actor = 12 * adapters + (4 * adapters if synced else 0)
    else:
        trained = params - (shape.vision_params if cfg.actor.vision.freeze else 0)
        actor = 4 * params + 8 * trained + (4 * params if synced and plan.needs_ref else 0)
    critic = 12 * params if plan.needs_critic else 0
    return {"checkpoint": actor + critic, "hf_export": 4 * params}
