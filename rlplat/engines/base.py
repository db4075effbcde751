"""The training-engine interface: one model, spread over the workers of a group by the engine's own
parallelism (FSDP shards it over data-parallel ranks; tensor/pipeline-parallel engines split it too).

An engine owns the micro-batch loop: given a batch and how to split it (:class:`MicroBatching`),
:meth:`TrainingEngine.infer` runs its micro-batches forward and :meth:`TrainingEngine.train_mini_batch`
runs them forward and backward through a loss function and steps the optimizer once (a pipeline-parallel schedule calls the loss itself, so the role cannot drive
forward and backward). The loss is computed by the role that owns the engine
(:mod:`rlplat.workers.actor_loss`), so engines know nothing about RL algorithms. Engines report where a
worker sits in their layout (:class:`ParallelLayout`): the controller splits batches by data-parallel
rank, replicates them across the model-parallel ranks of one replica, and collects one answer per replica.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from rlplat.config.derive import model_of
from rlplat.config.errors import ConfigError
from rlplat.engines.memory import MemoryLayout, hf_activations, model_state
from rlplat.engines.optim import LR_SCHEDULES, Optimizer
from rlplat.models.embedded import known_config
from rlplat.models.moe import is_moe
from rlplat.models.shape import ModelShape
from rlplat.models.vision import is_vision
from rlplat.protocol import Batch
from rlplat.registry import Registry

# <role>.<engine>.mixed_precision: auto = bf16 compute with fp32 weights on a GPU, fp32 on CPU
MIXED_PRECISION = ("auto", "none", "bf16")


@dataclass(frozen=True)
class ParallelLayout:
    """Where one worker sits among its engine's model replicas."""

    dp_rank: int  # which data-parallel replica this worker belongs to
    dp_size: int  # how many replicas (the batch is split into this many chunks)
    collects: bool = True  # this worker's answer is its replica's (exactly one worker per replica)


@dataclass
class ForwardOutput:
    """Per-token outputs for the response part of a micro-batch, ``[batch, response_len]`` (and a mixture of
    experts' routing and router loss)."""

    log_probs: torch.Tensor | None = None  # log π(response token) with logits / temperature
    entropy: torch.Tensor | None = None  # entropy of π(· | prefix) at each response position
    values: torch.Tensor | None = None  # critic value V(prefix before the token)
    sum_pi_squared: torch.Tensor | None = None  # Σ_v π(v | prefix)² at each response position (optimal baselines)
    # a mixture of experts' training forward: aux_loss_coef x the routers' load-balancing loss over the micro-batch's
    # real tokens (a scalar with its gradient) and the routing metrics (moe/*, micro-batch means); see rlplat.models.moe
    router_loss: torch.Tensor | None = None
    router_metrics: dict[str, float] | None = None
    # actor.moe.router_replay=r2's log-prob pass: the experts each token went to, [batch, P + R, layers, top_k] int16
    routed_experts: torch.Tensor | None = None


@dataclass(frozen=True)
class MicroBatching:
    """How an engine splits a batch into micro-batches: ``max_seqs`` rows each, or, with ``max_tokens``, pieces
    of at most that many real tokens (see :func:`micro_batches`)."""

    max_seqs: int
    max_tokens: int | None = None


#: what ``train_mini_batch`` calls per micro-batch: ``loss_fn(fwd, micro) -> (scalar loss, {metric: value})``
LossFn = Callable[[ForwardOutput, Batch], tuple[torch.Tensor, dict[str, float]]]


class TrainingEngine(ABC):
    """Interface of the training backends (registry: ``TRAINING_ENGINES``, key ``<role>.strategy``)."""

    optim: Optimizer | None  # None for a frozen engine (the reference policy)
    # the model's LoRA adapters (rlplat.engines.lora.LoRA) when model.lora.rank > 0 and the engine trains them
    lora = None
    #: it trains mixtures of experts (reporting their routing, with the routers' load-balancing loss: actor.moe);
    #: an engine that does not refuses an MoE model at start-up
    trains_experts = False
    #: its checkpoints hold the model as torch.distributed.checkpoint entries ``model.<Hugging Face name>`` (or
    #: LoRA's adapters under peft's names), which ``python -m rlplat.tools.export`` reads whatever the layout
    checkpoints_hf_names = False
    # tokens the forward passes were given (not padding) and computed (padding included); see packing_efficiency
    tokens_real: int = 0
    tokens_computed: int = 0

    def packing_efficiency(self, reset: bool = True) -> float | None:
        """Real over computed tokens of the forward passes since the last reset (1 = no padding computed);
        None when there were none."""
        ratio = self.tokens_real / self.tokens_computed if self.tokens_computed else None
        if reset:
            self.tokens_real = self.tokens_computed = 0
        return ratio

    @classmethod
    def check_config(cls, cfg, role: str, world_size: int, device: str) -> None:
        """Raise ConfigError, naming the key, for a setting this engine cannot run with as ``role``
        ("actor", "critic", "ref", "teacher") on ``world_size`` workers of ``device``: its own section
        ``<role>.<strategy>`` and, for a trained role, ``<role>.optim``. Called at start-up."""
        optim = cfg[role].get("optim")
        if optim is not None and optim.lr_schedule not in LR_SCHEDULES:
            raise ConfigError(f"{role}.optim.lr_schedule={optim.lr_schedule!r} is not one of: {', '.join(LR_SCHEDULES)}")
        model = model_of(cfg, role)
        known, path = known_config(model), f"{'teacher.model_path' if role == 'teacher' else 'model.path'}={model.path}"
        if not cls.trains_experts and is_moe(known):
            raise ConfigError(f"{role}.strategy={cfg[role].strategy}: {path} is a mixture of experts, which this "
                              f"engine does not train yet; use {role}.strategy=fsdp")
        if not cls.trains_vision and is_vision(known):
            raise ConfigError(f"{role}.strategy={cfg[role].strategy}: {path} is a vision-language model, which this "
                              f"engine does not train (docs/vision.md); use {role}.strategy=fsdp")

    @classmethod
    def computes_in(cls, engine_cfg, device: str) -> str:
        """The dtype this engine's forward computes in with its section ``engine_cfg`` on ``device``
        ("cpu" | "cuda"); read by the run plan. ``mixed_precision`` auto and bf16 compute in bfloat16
        (weights, gradients and optimizer stay float32) on a GPU; on CPU everything is float32."""
        mixed = engine_cfg.get("mixed_precision", "none") if engine_cfg is not None else "none"  # None: no section
        on_gpu_bf16 = device == "cuda" and mixed in ("auto", "bf16")
        return "bfloat16" if on_gpu_bf16 else "float32"

    @classmethod
    def describe(cls, engine_cfg, device: str, shape) -> str:
        """How this engine runs a model of ``shape`` (rlplat.models.shape) with its section ``engine_cfg`` on
        ``device``, in a few words for the plan's header; "" when there is nothing to say."""
        return ""

    # ------------------------------------------------- declarations for the plan's memory estimate (rlplat.planner)
    #: what to turn when the update does not fit (the plan prints it)
    update_knob = ("model.gradient_checkpointing=true, a smaller actor.micro_batch_size_seqs_per_worker or "
                   "actor.micro_batch_max_tokens_per_worker")

    @classmethod
    def memory_layout(cls, section, world: int, replicas: int) -> MemoryLayout:
        """How this engine splits ``role``'s model (its section ``section``) over ``world`` workers forming
        ``replicas`` replicas; by default each worker holds the whole model."""
        return MemoryLayout(replicas=replicas)

    @classmethod
    def memory_state(cls, shape: ModelShape, cfg, role: str, lay: MemoryLayout, compute_bytes: int,
                     trained: bool) -> dict[str, float]:
        """What one device holds of ``role``'s model between passes, by named part in bytes: by default float32
        weights, and for a trained model gradients and AdamW's moments (:func:`~rlplat.engines.memory.model_state`)."""
        return model_state(shape, cfg, role, lay, trained)

    @classmethod
    def memory_activations(cls, shape: ModelShape, cfg, role: str, lay: MemoryLayout, tokens: int,
                           response_tokens: int, compute_bytes: int, grad: bool, seq: int) -> dict[str, float]:
        """What a forward pass over ``tokens`` (``response_tokens`` of them scored) of sequences of ``seq``
        tokens holds on one worker, with ``grad`` for the backward pass; by default a Hugging Face model's
        (:func:`~rlplat.engines.memory.hf_activations`)."""
        return hf_activations(shape, cfg, lay, tokens, response_tokens, compute_bytes, grad, seq)

    @classmethod
    def keeps_gradients(cls, cfg, role: str, lay: MemoryLayout, compute_bytes: int) -> bool:
        """Whether the gradients stay on the device between updates (else they exist from the first backward to
        the optimizer step)."""
        return False

    @classmethod
    def lends_weights(cls, cfg, role: str, lay: MemoryLayout) -> bool:
        """Whether a worker holds the live weights whole (:meth:`live_weights`), which a colocated rollout engine
        may then use instead of a copy of its own."""
        return False

    @property
    @abstractmethod
    def layout(self) -> ParallelLayout:
        """This worker's place among the model replicas (see :class:`ParallelLayout`)."""

    @abstractmethod
    def all_reduce_dp(self, values: list[float], op: str = "sum") -> list[float]:
        """Sum (``op="max"``: the largest of) a few Python numbers over the data-parallel replicas (e.g. a
        mini-batch's token count)."""

    @abstractmethod
    def forward(self, micro: Batch, *, temperature: float = 1.0, need_entropy: bool = False,
                need_sum_pi_squared: bool = False, grad: bool = False) -> ForwardOutput:
        """The response-part outputs of one micro-batch (fields ``input_ids``, ``attention_mask``,
        ``position_ids``, ``responses``); ``grad=False`` runs without autograd."""

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradients of one micro-batch's ``loss`` (already scaled with the global
        denominators; summed over replicas by :meth:`reduce_gradients` or by the engine's wrapper)."""
        loss.backward()

    def own_routing(self):
        """A context in which a mixture of experts' forwards route with its own routers, replaying no recorded
        routing (``actor.moe.router_replay``): for sequences no rollout sampled, such as the weight sync's probe.
        Nothing for an engine that replays none."""
        return contextlib.nullcontext()

    def reduce_gradients(self) -> None:
        """After the last micro-batch: make the gradients the sum over the data-parallel replicas (an
        engine whose wrapper already did, such as FSDP's, keeps this no-op)."""

    def infer(
        self, batch: Batch, *, split: MicroBatching, temperature: float = 1.0, need_entropy: bool = False,
        need_sum_pi_squared: bool = False,
    ) -> dict[str, torch.Tensor]:
        """No-grad forward over ``batch`` in micro-batches (``split``); the non-empty :class:`ForwardOutput`
        fields, concatenated as float32 CPU tensors ``[rows, response_len]`` by name (``routed_experts`` as it is)."""
        outputs: dict[str, list[torch.Tensor]] = {}
        for micro in micro_batches(self, batch, split):
            fwd = self.forward(micro, temperature=temperature, need_entropy=need_entropy,
                               need_sum_pi_squared=need_sum_pi_squared)
            for name in ("log_probs", "entropy", "values", "sum_pi_squared"):
                if (value := getattr(fwd, name)) is not None:
                    outputs.setdefault(name, []).append(value.float().cpu())
            if fwd.routed_experts is not None:
                outputs.setdefault("routed_experts", []).append(fwd.routed_experts)
        return {name: torch.cat(parts) for name, parts in outputs.items()}

    def train_mini_batch(
        self, mini: Batch, loss_fn: LossFn, *, split: MicroBatching, temperature: float = 1.0,
        need_entropy: bool = False,
    ) -> dict[str, float]:
        """Forward and backward every micro-batch of ``mini`` (``split``) through ``loss_fn`` (its losses already
        scaled with the mini-batch's global denominators, so they add up to the mini-batch loss), then one
        optimizer step
        (``self.optim``, an :class:`~rlplat.engines.optim.Optimizer`; None = frozen engine). Returns the
        loss functions' metrics summed over micro-batches and data-parallel replicas, plus ``grad_norm``
        and ``lr``. A pipeline-parallel engine overrides this with its schedule."""
        self._check_trainable()
        metrics: dict[str, float] = {}
        for micro in micro_batches(self, mini, split):
            fwd = self.forward(micro, temperature=temperature, need_entropy=need_entropy, grad=True)
            loss, micro_metrics = loss_fn(fwd, micro)
            self.backward(loss)
            add_metrics(metrics, micro_metrics)
        return self._step_optimizer(metrics)

    def _check_trainable(self) -> None:
        if self.optim is None:
            raise RuntimeError("this engine is frozen (built without an optimizer)")

    def _step_optimizer(self, metrics: dict[str, float]) -> dict[str, float]:
        """The end of :meth:`train_mini_batch`, once every micro-batch went backward: the gradients summed over
        the replicas (:meth:`reduce_gradients`), one optimizer step; returns ``metrics`` (this replica's,
        summed over its micro-batches) summed over the replicas, plus the step's ``grad_norm`` and ``lr``."""
        self.reduce_gradients()
        keys = sorted(metrics)
        summed = dict(zip(keys, self.all_reduce_dp([metrics[k] for k in keys])))
        summed.update(self.optim.step())
        return summed

    trains_vision = False  # it trains vision-language models (their images; an actor's: the ``vision`` section)
    #: the names of weights no update changes (a frozen vision tower): the weight sync leaves them out
    frozen_names: frozenset[str] = frozenset()

    @abstractmethod
    def export_weights(
        self, dtype: torch.dtype | None = None, bucket_bytes: int = 512 * 2**20
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Yield the full (unsharded) weights in Hugging Face naming, cast to ``dtype`` (None = as
        trained), in buckets of about ``bucket_bytes``: one collective per bucket, and no rank ever holds
        more than one bucket of full weights. Collective: every rank must iterate to the end."""

    @abstractmethod
    def blend_weights(self, buckets: Iterable[list[tuple[str, torch.Tensor]]], alpha: float) -> None:
        """Every weight <- alpha * given + (1 - alpha) * weight (alpha = 1 copies), from full tensors in
        Hugging Face naming as :meth:`export_weights` yields them (e.g. the actor's, into the reference).
        Each rank updates its own shard; every weight of this model must be given."""

    def live_weights(self) -> dict[str, torch.Tensor] | None:
        """The full weights under Hugging Face names as the live tensors the optimizer updates in place,
        when this worker holds them whole on its device (then a colocated rollout engine can use them
        without a copy); None otherwise. Tied weights appear under each name, as the same tensor."""
        return None

    def close(self) -> None:
        """Release what the engine holds beyond its tensors (e.g. process-group state) before the worker's
        process group is destroyed."""

    @abstractmethod
    def save_checkpoint(self, path: str) -> None:
        """Write the sharded training state (weights, optimizer, LR schedule, RNG) under ``path``.
        Collective: every rank calls it with the same path."""

    @abstractmethod
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (same world size). Collective."""

    @property
    @abstractmethod
    def model(self) -> torch.nn.Module: ...


def add_metrics(total: dict[str, float], micro: dict[str, float]) -> None:
    """``total[k] += micro[k]`` for each of a micro-batch's metrics (missing keys start at 0)."""
    for k, v in micro.items():
        total[k] = total.get(k, 0.0) + v


def check_mixed_precision(value: str, key: str, device: str, on_cpu: str) -> None:
    """ConfigError unless ``<key>=value`` is one of :data:`MIXED_PRECISION` and, for ``bf16``, the run has a GPU;
    ``on_cpu`` says why the engine cannot compute in bf16 elsewhere."""
    if value not in MIXED_PRECISION:
        raise ConfigError(f"{key}={value!r} is not one of: {', '.join(MIXED_PRECISION)}")
    if value == "bf16" and device != "cuda":
        raise ConfigError(f"{key}=bf16 needs a GPU (trainer.device resolved to {device}): {on_cpu}")


def micro_batches(engine: TrainingEngine, batch: Batch, split: MicroBatching) -> list[Batch]:
    """``engine``'s micro-batches of ``batch`` (this replica's rows): ``split.max_seqs`` rows each, or, with a token
    budget, contiguous pieces of at most ``split.max_tokens`` real tokens (prompt + response; a longer
    sequence is a piece of its own), filled in order. Every data-parallel replica runs as many pieces as the
    fullest needs (the engines' collectives, such as FSDP's gathers, pair up forward passes): a replica that
    needs fewer halves its largest pieces."""
    if split.max_tokens is None:
        return batch.split(split.max_seqs)
    lengths = batch.tensors["attention_mask"].sum(-1).tolist()
    pieces: list[list[int]] = [[]]  # row indices
    used = 0  # tokens in the last piece
    for row, length in enumerate(lengths):
        if pieces[-1] and used + length > split.max_tokens:
            pieces.append([])
            used = 0
        pieces[-1].append(row)
        used += length
    count = int(engine.all_reduce_dp([len(pieces)], op="max")[0])
    if count > len(batch):
        raise RuntimeError(f"{count} micro-batches for {len(batch)} rows: replicas hold different row counts")
    while len(pieces) < count:  # halve the piece with the most tokens among those of 2+ rows
        at = max((i for i, p in enumerate(pieces) if len(p) > 1), key=lambda i: sum(lengths[r] for r in pieces[i]))
        half = len(pieces[at]) // 2
        pieces[at:at + 1] = [pieces[at][:half], pieces[at][half:]]
    return [batch[p[0]:p[-1] + 1] for p in pieces]


def blend_(target: torch.Tensor, source: torch.Tensor, alpha: float) -> None:
    """``target <- alpha * source + (1 - alpha) * target`` in place; alpha = 1 is an exact copy."""
    if alpha == 1.0:
        target.copy_(source)
    else:
        target.mul_(1.0 - alpha).add_(source.to(target.dtype), alpha=alpha)


def check_blended(given: set[str], expected: Iterable[str]) -> None:
    """:meth:`TrainingEngine.blend_weights` must receive every weight of the model, and nothing else."""
    expected = set(expected)
    if given != expected:
        raise ValueError(f"blend_weights: the given weights do not match this model (missing "
                         f"{sorted(expected - given)[:4]}, unexpected {sorted(given - expected)[:4]})")


TRAINING_ENGINES: Registry[type[TrainingEngine]] = Registry("training engine")


def save_rank_state(path: str, rank: int, optim: Optimizer | None) -> None:
    """What a checkpoint keeps per rank beside the sharded tensors: the random number generators' states and
    the LR schedule's position (``extra_rank<rank>.pt``)."""
    import random

    import numpy as np

    rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save({"rng": rng, "scheduler": optim.scheduler.state_dict() if optim else None},
               f"{path}/extra_rank{rank}.pt")


def load_rank_state(path: str, rank: int, optim: Optimizer | None) -> None:
    """Restore what :func:`save_rank_state` wrote."""
    import random

    import numpy as np

    extra = torch.load(f"{path}/extra_rank{rank}.pt", weights_only=False)
    if optim is not None:
        optim.scheduler.load_state_dict(extra["scheduler"])
    rng = extra["rng"]
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
