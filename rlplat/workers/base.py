"""What every worker is: its rank, its place in the process group, and the methods the controller may call.

A worker method declares how a call on its group reaches it with ``@register(Dispatch.X)``; the
controller's worker groups (:mod:`rlplat.controller`) read that mark to split the arguments and collect
the answers. The modes:

==================  ==========================================================================
``ONE_TO_ALL``      every worker gets the same arguments; the list of their results comes back
``DP_SPLIT``        :class:`~rlplat.protocol.Batch` arguments are split into one equal chunk per
                    data-parallel replica, padded first if the length does not divide (inference);
                    the workers of one replica (tensor/pipeline ranks) get the same chunk; the
                    collecting worker of each replica answers, and the chunks' Batch results are
                    concatenated and the padding removed ("collect")
``DP_SPLIT_EXACT``  like DP_SPLIT but refuses to pad: for training, where a duplicated row would
                    change the gradient; non-Batch results come back as a list, one per rank
==================  ==========================================================================

Where a worker sits among the replicas comes from :meth:`Worker.parallel_layout` (every worker its own
replica unless its engine says otherwise, see :class:`rlplat.engines.ParallelLayout`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from rlplat.engines.base import ParallelLayout
from rlplat.engines.dist import DistContext, device_context, init_distributed, node_ip
from rlplat.utils.net import free_port

DISPATCH_ATTR = "__rlplat_dispatch__"
GROUP_ATTR = "__rlplat_concurrency_group__"


class Dispatch(enum.Enum):
    ONE_TO_ALL = "one_to_all"
    DP_SPLIT = "dp_split"
    DP_SPLIT_EXACT = "dp_split_exact"


def register(mode: Dispatch, concurrency_group: str | None = None) -> Callable[[Callable], Callable]:
    """Mark a worker method as callable from the controller, with its dispatch mode. A worker runs its calls one
    at a time in the order submitted; a method of a ``concurrency_group`` (one of the class's
    :attr:`Worker.concurrency_groups`) runs in that group's thread instead, beside the others (Ray workers)."""

    def decorator(fn: Callable) -> Callable:
        setattr(fn, DISPATCH_ATTR, mode)
        setattr(fn, GROUP_ATTR, concurrency_group)
        return fn

    return decorator


def concurrency_group(worker_cls: type, name: str) -> str | None:
    """The concurrency group ``name``'s ``register`` gave it (None: the worker's calls in order)."""
    return getattr(getattr(worker_cls, name, None), GROUP_ATTR, None)


def dispatch_mode(worker_cls: type, name: str) -> Dispatch:
    fn = getattr(worker_cls, name, None)
    mode = getattr(fn, DISPATCH_ATTR, None)
    if mode is None:
        exposed = sorted(n for n in dir(worker_cls) if getattr(getattr(worker_cls, n), DISPATCH_ATTR, None))
        raise AttributeError(
            f"{worker_cls.__name__}.{name} is not a worker method registered with @register(Dispatch...); "
            f"exposed: {', '.join(exposed)}"
        )
    return mode


class Worker:
    """Base of every role class. Subclasses receive their rank and world size and the role's kwargs;
    heavy set-up belongs in a ``@register(Dispatch.ONE_TO_ALL)`` method the controller calls."""

    #: threads of their own for some methods (``register(..., concurrency_group=name)``): name -> calls at once
    concurrency_groups: dict[str, int] = {}
    #: its workers never call a collective over their group, so one can be replaced alone (a rollout worker)
    works_alone = False

    def __init__(self, rank: int, world_size: int, device: str):
        self.rank, self.world_size, self.device_type = rank, world_size, device
        self.dist: DistContext | None = None

    def master_address(self) -> tuple[str, int]:
        return node_ip(), free_port()

    def use_threads(self, threads: int) -> None:
        """Compute with ``threads`` CPU threads (Ray starts a 1-CPU actor with one: OMP_NUM_THREADS=1)."""
        import os

        import torch

        os.environ["OMP_NUM_THREADS"] = str(threads)  # for the processes this worker starts (e.g. vLLM's)
        torch.set_num_threads(threads)

    def import_modules(self, modules: list[tuple[str, str | None]]) -> None:
        """Import the user's plug-in modules (``trainer.imports``) so their registrations exist here too."""
        from rlplat.config.imports import import_in_worker

        import_in_worker(modules)

    @register(Dispatch.ONE_TO_ALL)
    def setup_distributed(self, master: tuple[str, int]) -> int:
        """Join the group's torch.distributed process group at ``master`` (rank 0's ``master_address()``)."""
        self.dist = init_distributed(self.rank, self.world_size, *master, self.device_type)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def setup_alone(self) -> int:
        """A worker that replaces a dead one of a :attr:`works_alone` group: its rank and device, no process group."""
        self.dist = device_context(self.rank, self.world_size, self.device_type)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def parallel_layout(self) -> ParallelLayout:
        """This worker's data-parallel replica; by default every worker is one."""
        return ParallelLayout(dp_rank=self.rank, dp_size=self.world_size)

    def close(self) -> None:
        """Release what the worker holds before its process group is destroyed (no-op by default)."""
