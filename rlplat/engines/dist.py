"""torch.distributed set-up for one worker: gloo on CPU, nccl on GPU, a 1-D data-parallel mesh."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


def node_ip() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


@dataclass(frozen=True)
class DistContext:
    """Where this worker sits: its rank among ``world_size`` data-parallel workers, and its device."""

    rank: int
    world_size: int
    device: torch.device
    local_rank: int = 0

    @property
    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    def mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.device.type, (self.world_size,), mesh_dim_names=("dp",))

    def replica_groups(self, size: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
        """For replicas of ``size`` consecutive ranks: this rank's group across the replicas (the ranks at its
        place in each) and its replica's group. Every rank must call it, in the same order."""
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(self.device.type, (self.world_size // size, size), mesh_dim_names=("dp", "sp"))
        return mesh.get_group("dp"), mesh.get_group("sp")

    def all_reduce(self, values: list[float], op: str = "sum", group: dist.ProcessGroup | None = None) -> list[float]:
        """Sum (or ``op="max"``) a few Python numbers over all ranks, or ``group`` (e.g. global token counts for
        the loss)."""
        if self.world_size == 1:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=REDUCE_OPS[op], group=group)
        return tensor.tolist()


def device_context(rank: int, world_size: int, device: str) -> DistContext:
    """This worker's place and device, without joining a process group. On GPU each worker sees the device Ray
    assigned to it (or the only one), so the local device is ``cuda:0`` unless ``LOCAL_RANK`` says otherwise."""
    if device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", 0)) if torch.cuda.device_count() > 1 else 0
        torch.cuda.set_device(local_rank)
        return DistContext(rank, world_size, torch.device("cuda", local_rank), local_rank)
    return DistContext(rank, world_size, torch.device("cpu"))


def init_distributed(rank: int, world_size: int, master_addr: str, master_port: int, device: str) -> DistContext:
    """Join the process group (idempotent for the same world) and pick this worker's device (:func:`device_context`)."""
    ctx = device_context(rank, world_size, device)
    if dist.is_initialized():
        if dist.get_world_size() != world_size or dist.get_rank() != rank:
            raise RuntimeError(
                f"torch.distributed is already initialised as rank {dist.get_rank()}/{dist.get_world_size()}; "
                f"cannot join as {rank}/{world_size} in the same process"
            )
        return ctx
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(master_port)
    dist.init_process_group(backend=ctx.backend, rank=rank, world_size=world_size)
    return ctx
