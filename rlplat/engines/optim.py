"""The optimizer and learning-rate schedule every training engine uses (``actor.optim``, ``critic.optim``).

AdamW with decoupled weight decay, a linear warmup and then a constant, linear or cosine schedule down to
``min_lr_ratio``; gradients are clipped to ``grad_clip`` (global norm) and a step whose gradient norm is
not finite is skipped (the optimizer state stays as it was; the trainer decides whether to stop).

An engine whose replicas each hold whole weights (Megatron's data parallelism) can shard the optimizer
over them (``shard_group``; Megatron-Core's "distributed optimizer", ZeRO stage 1): each replica keeps
AdamW's state only for its share of the weights (whole tensors, dealt largest first to the replica with
the fewest elements so far), steps that share with the summed gradients and broadcasts it to the others.
The update is the unsharded one; the state takes 1 / dp of the memory. A mixture of experts' expert weights are
held by fewer replicas (those of their expert-data-parallel group: expert parallelism puts other experts on the
other ranks), so ``shard_group`` may name each weight's group. FSDP needs none of this: its weights, and so its
moments, are already sharded.

Weights kept in bf16 (``master_weights``; Megatron-LM's mixed-precision recipe, Micikevicius et al. 2018,
"Mixed Precision Training") are stepped through fp32 master copies: each backward pass adds a weight's
gradient into an fp32 buffer of its own (its "main gradient", :meth:`Optimizer.grad`, which the engine sums
over the replicas), AdamW updates an fp32 copy of each weight this process steps with it, and the weight
takes the rounded result. Gradients summed over micro-batches and replicas, and small updates, then keep
the precision bf16's 8-bit mantissa would lose. With sharding, each replica holds the masters of its share
only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from omegaconf import DictConfig

LR_SCHEDULES = ("constant", "linear", "cosine")  # {actor,critic}.optim.lr_schedule, after the warmup


def lr_lambda(schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float):
    """LR multiplier per optimizer step: linear warmup to 1 over ``warmup_steps`` (the first step
    already gets 1/warmup, never 0), then constant, linear or cosine decay to ``min_lr_ratio``."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown LR schedule {schedule!r}; known: {', '.join(LR_SCHEDULES)}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        decay = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return min_lr_ratio + (1.0 - min_lr_ratio) * decay

    return factor


class Optimizer:
    """AdamW + LR schedule + clipping over ``params``, for ``total_steps`` optimizer steps. ``grad_norm``
    computes the global gradient norm of ``params`` (default: over the local tensors, DTensors gathered);
    a tensor-parallel engine passes one that counts each shard once. ``shard_group``: the processes that
    hold the same ``params`` (data-parallel replicas) and share the optimizer state out among them, or a function
    giving each weight's (a mixture of experts' expert weights: their expert-data-parallel group); ``shard_unit``:
    a key per weight, the weights of one key stepped by one replica (those a checkpoint writes as one tensor: a
    layer's local experts).
    ``master_weights``: accumulate fp32 gradients and step fp32 copies of the weights (kept in a lower
    precision); the engine reads and reduces the gradients through :meth:`grad`. ``flat_state``: keep
    the gradients and AdamW's moments of plain (unsharded) fp32 ``params`` in flat buffers for the whole
    run (:func:`attach_flat_grads`)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], optim_cfg: DictConfig, total_steps: int,
                 grad_norm: Callable[[list[torch.nn.Parameter]], torch.Tensor] | None = None,
                 shard_group: dist.ProcessGroup | Callable[[torch.nn.Parameter], dist.ProcessGroup] | None = None,
                 shard_unit: Callable[[torch.nn.Parameter], object] | None = None, master_weights: bool = False,
                 flat_state: bool = False):
        self.params = [p for p in params if p.requires_grad]
        # each sharded weight's group (of more than one process) and the rank in it that steps the weight
        self._group_of, self._owner_of = _shards(self.params, shard_group, shard_unit)
        self.stepped = [p for p in self.params if self.steps_locally(p)]
        # each stepped weight's tensor that AdamW updates: an fp32 copy (master_weights), else the weight
        self.masters = {p: p.detach().to(torch.float32, copy=True) for p in self.stepped} if master_weights else None
        # master_weights: every weight's gradient summed in fp32 (also those another replica steps: the engine
        # sums them over the replicas), and which weights got one since the last step
        self.main_grads = {p: torch.zeros_like(p, dtype=torch.float32) for p in self.params} if master_weights \
            else None
        self._touched: set[torch.nn.Parameter] = set()
        for param in self.params if master_weights else ():
            param.register_post_accumulate_grad_hook(self._accumulate)
        targets = self._targets()
        self.grad_buffer = attach_flat_grads(self.params) if flat_state and not (master_weights or self._owner_of) \
            else None
        self.grad_norm = grad_norm or _local_grad_norm
        self.grad_clip = optim_cfg.grad_clip
        # fused: one kernel for every tensor (on CPU ~4x faster than the default per-tensor loop at 25M
        # parameters, docs/performance.md); float weights on CPU or CUDA, as the engines keep them
        fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in targets)
        self.optimizer = torch.optim.AdamW(targets, lr=optim_cfg.lr, betas=tuple(optim_cfg.betas), eps=optim_cfg.eps,
                                           weight_decay=optim_cfg.weight_decay, fused=fused or None)
        if self.grad_buffer is not None:
            _start_flat_moments(self.optimizer, self.params)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lr_lambda(optim_cfg.lr_schedule, optim_cfg.warmup_steps, total_steps, optim_cfg.min_lr_ratio),
        )

    def step(self) -> dict[str, float]:
        """Clip, step (unless the gradient norm is not finite), zero the gradients, advance the schedule;
        return ``grad_norm`` and the ``lr`` this step used."""
        grad_norm = self.grad_norm(self.params)
        if self.masters is not None:  # the fp32 gradients of the weights stepped here
            for param, master in self.masters.items():
                master.grad = self.main_grads[param] if param in self._touched else None
        if self.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self._targets(), self.grad_clip, grad_norm)
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: a DTensor
        lr = self.scheduler.get_last_lr()[0]
        if torch.isfinite(grad_norm):
            self.optimizer.step()
            self._publish()
        if self.grad_buffer is not None:
            self.grad_buffer.zero_()
        else:
            self.optimizer.zero_grad(set_to_none=True)
            for param in self.params:
                param.grad = None
        for grad in (self.main_grads or {}).values():
            grad.zero_()
        self._touched.clear()
        self.scheduler.step()
        return {"grad_norm": float(grad_norm), "lr": lr}

    def grad(self, param: torch.nn.Parameter) -> torch.Tensor | None:
        """``param``'s gradient as the optimizer will use it (to sum over replicas, to clip by): its fp32 main
        gradient with ``master_weights`` (None before any backward pass reached it), else ``param.grad``."""
        if self.main_grads is None:
            return param.grad
        return self.main_grads[param] if param in self._touched else None

    def _accumulate(self, param: torch.nn.Parameter) -> None:
        """After a backward pass put a bf16 gradient in ``param.grad``: add it to the fp32 main gradient."""
        self.main_grads[param].add_(param.grad)
        param.grad = None
        self._touched.add(param)

    def _targets(self) -> list[torch.Tensor]:
        return list(self.masters.values()) if self.masters is not None else self.stepped

    def _publish(self) -> None:
        """The stepped values into the weights: each master rounded into its weight, and with sharding every
        weight broadcast from the replica that stepped it."""
        with torch.no_grad():
            for param, master in (self.masters or {}).items():
                param.copy_(master)
            works = [dist.broadcast(param.data, src=dist.get_global_rank(self._group_of[param], owner),
                                    group=self._group_of[param], async_op=True)
                     for param, owner in self._owner_of.items()]
            for work in works:
                work.wait()

    @property
    def local_state(self) -> dict[torch.nn.Parameter, dict[str, torch.Tensor]]:
        """AdamW's state (``step``, ``exp_avg``, ``exp_avg_sq``) of the weights this process steps (all of
        them, or its share when sharded) that have taken a step or been given state by :meth:`start_state`.
        The dicts are AdamW's own: a checkpoint load writes into them."""
        state = self.optimizer.state
        return {param: state[target] for param, target in zip(self.stepped, self._targets()) if target in state}

    def start_state(self) -> None:
        """Give every weight this process steps the state its first step would (zero moments), to load a
        checkpoint into."""
        for target in self._targets():
            if target not in self.optimizer.state:
                self.optimizer.state[target] = {"step": torch.zeros((), dtype=torch.float32, device=target.device),
                                                "exp_avg": torch.zeros_like(target),
                                                "exp_avg_sq": torch.zeros_like(target)}

    def steps_locally(self, param: torch.nn.Parameter) -> bool:
        """Whether this process keeps ``param``'s optimizer state (always, unless sharded)."""
        return param not in self._owner_of or self._owner_of[param] == dist.get_rank(self._group_of[param])


def _shards(params: list[torch.nn.Parameter], shard_group, shard_unit) -> tuple[dict, dict]:
    """Each sharded weight's group and the rank of that group that steps it (:func:`shard_owners` within each group,
    over the units of ``shard_unit``, each weight its own by default): the weights whose group (``shard_group``, or
    ``shard_group(weight)``) has more than one process."""
    members: dict[dist.ProcessGroup, dict[object, list[torch.nn.Parameter]]] = {}
    for param in params if shard_group is not None else ():
        group = shard_group(param) if callable(shard_group) else shard_group
        if dist.get_world_size(group) > 1:
            members.setdefault(group, {}).setdefault(shard_unit(param) if shard_unit else param, []).append(param)
    group_of, owner_of = {}, {}
    for group, units in members.items():
        replicas, units = dist.get_world_size(group), list(units.values())
        owners = shard_owners([sum(p.numel() for p in unit) for unit in units], replicas)
        if len(set(owners)) < replicas:  # every replica computes the same owners: all of them stop
            raise ValueError(f"the optimizer is sharded over {replicas} replicas, more than there are weights they "
                             f"share ({len(units)}); use fewer data-parallel replicas or an unsharded optimizer")
        for unit, owner in zip(units, owners):
            group_of.update(dict.fromkeys(unit, group))
            owner_of.update(dict.fromkeys(unit, owner))
    return group_of, owner_of


def shard_owners(sizes: list[int], replicas: int) -> list[int]:
    """The replica that steps each unit of weights (of ``sizes`` elements): largest first, each to the replica
    holding the fewest elements so far (lowest index on a tie), so that every replica computes the same
    assignment."""
    owners, load = [0] * len(sizes), [0] * replicas
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        owners[index] = min(range(replicas), key=lambda r: load[r])
        load[owners[index]] += sizes[index]
    return owners


def attach_flat_grads(params: list[torch.nn.Parameter]) -> torch.Tensor | None:
    """Give every parameter a zeroed ``.grad`` that is a view of one flat buffer, and return the buffer
    (None, attaching nothing, unless the parameters are plain tensors of one dtype on one device).

    The backward pass then adds each gradient into its view instead of keeping the tensor it computed. A
    gradient set to None after each step is allocated again in the next backward pass, at whatever place
    the allocator finds among the activations being freed; there it stays through the optimizer step and
    splits the free memory that the next forward pass's activations would fill, so the heap grows by more
    than the activations need (glibc's malloc on CPU; docs/performance.md). One buffer above malloc's mmap
    threshold is mapped on its own, outside that heap, the way DDP keeps gradients as views of its buckets
    (``gradient_as_bucket_view``). As there, a parameter that gets no gradient in a step is stepped with
    a zero one (AdamW skips a parameter whose gradient is None).
    """
    if not params or any(type(p.data) is not torch.Tensor for p in params):
        return None  # e.g. FSDP's DTensor parameters, whose gradients FSDP allocates itself
    if len({(p.dtype, p.device) for p in params}) != 1:
        return None
    buffer = params[0].new_zeros(sum(p.numel() for p in params))
    for p, view in zip(params, _views(buffer, params)):
        p.grad = view
    return buffer


def _start_flat_moments(optimizer: torch.optim.AdamW, params: list[torch.nn.Parameter]) -> None:
    """Start AdamW's state as its first step would (step 0, both moments zero), with the moments as views
    of one buffer, for the reason given in :func:`attach_flat_grads`. Loaded through ``load_state_dict``,
    which keeps tensors of the parameters' dtype and device as they are given."""
    exp_avg, exp_avg_sq = params[0].new_zeros(2, sum(p.numel() for p in params))
    state = {index: {"step": torch.tensor(0.0), "exp_avg": first, "exp_avg_sq": second}
             for index, (first, second) in enumerate(zip(_views(exp_avg, params), _views(exp_avg_sq, params)))}
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


def _views(flat: torch.Tensor, params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """Consecutive pieces of ``flat``, shaped like ``params``."""
    pieces = flat.split([p.numel() for p in params])
    return [piece.view_as(p) for piece, p in zip(pieces, params)]


def _local_grad_norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
