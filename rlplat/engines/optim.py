"""The optimizer and learning-rate schedule every training engine uses (``actor.optim``, ``critic.optim``).

AdamW with decoupled weight decay, a linear warmup and then a constant, linear or cosine schedule down to
``min_lr_ratio``; gradients are clipped to ``grad_clip`` (global norm) and a step whose gradient norm is
not finite is skipped (the optimizer state stays as it was; the trainer decides whether to stop).

An engine whose replicas each hold whole weights (Megatron's data parallelism) can shard the optimizer
over them (``shard_group``; Megatron-Core's "distributed optimizer", ZeRO stage 1): each replica keeps
AdamW's two moments only for its share of the weights, steps that share with the summed gradients and
broadcasts it to the others (torch's ``ZeroRedundancyOptimizer``, which assigns whole tensors, largest
share first). The update is the unsharded one; the moments, two thirds of fp32 training state, take
1 / dp of the memory. FSDP needs none of this: its weights, and so its moments, are already sharded.
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
    hold the same ``params`` (data-parallel replicas) and share the optimizer state out among them.
    ``flat_state``: keep the gradients and AdamW's moments of plain (unsharded) ``params`` in flat buffers
    for the whole run (:func:`attach_flat_grads`)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], optim_cfg: DictConfig, total_steps: int,
                 grad_norm: Callable[[list[torch.nn.Parameter]], torch.Tensor] | None = None,
                 shard_group: dist.ProcessGroup | None = None, flat_state: bool = False):
        self.params = [p for p in params if p.requires_grad]
        self.grad_buffer = attach_flat_grads(self.params) if flat_state else None
        self.grad_norm = grad_norm or _local_grad_norm
        self.grad_clip = optim_cfg.grad_clip
        # fused: one kernel for every tensor (on CPU ~4x faster than the default per-tensor loop at 25M
        # parameters, docs/performance.md); float weights on CPU or CUDA, as the engines keep them
        fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in self.params)
        adamw = dict(lr=optim_cfg.lr, betas=tuple(optim_cfg.betas), eps=optim_cfg.eps,
                     weight_decay=optim_cfg.weight_decay, fused=fused or None)
        if shard_group is not None and dist.get_world_size(shard_group) > 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            self.optimizer = ZeroRedundancyOptimizer(self.params, optimizer_class=torch.optim.AdamW,
                                                     process_group=shard_group, **adamw)
        else:
            self.optimizer = torch.optim.AdamW(self.params, **adamw)
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
        if self.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.grad_clip, grad_norm)
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: a DTensor
        lr = self.scheduler.get_last_lr()[0]
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        if self.grad_buffer is not None:
            self.grad_buffer.zero_()
        else:
            self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return {"grad_norm": float(grad_norm), "lr": lr}

    @property
    def local_state(self) -> dict[torch.nn.Parameter, dict[str, torch.Tensor]]:
        """AdamW's state (``step``, ``exp_avg``, ``exp_avg_sq``) of the parameters this process steps: all
        of them, or its share when sharded. Written to in place by a checkpoint load."""
        inner = getattr(self.optimizer, "optim", self.optimizer)  # a ZeroRedundancyOptimizer's local AdamW
        return inner.state

    def steps_locally(self, param: torch.nn.Parameter) -> bool:
        """Whether this process keeps ``param``'s optimizer state (always, unless sharded)."""
        owner = getattr(self.optimizer, "_param_to_rank", None)
        return owner is None or owner[param] == self.optimizer.rank


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
