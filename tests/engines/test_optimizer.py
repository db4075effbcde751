"""The optimizer sharded over data-parallel replicas (Megatron's distributed optimizer, ZeRO-1): two gloo
processes each keep AdamW's state for a share of the weights, and their steps equal the unsharded AdamW's."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from rlplat.engines.dist import free_port
from rlplat.engines.optim import Optimizer

CFG = OmegaConf.create({"lr": 1e-2, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.1,
                        "lr_schedule": "cosine", "warmup_steps": 1, "min_lr_ratio": 0.1, "grad_clip": 0.5})


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(11, 6), torch.nn.Linear(6, 8), torch.nn.Linear(8, 3))


def steps(net: torch.nn.Module, optim: Optimizer, rank: int, world: int) -> None:
    """Three steps on this rank's rows; the gradients summed over the ranks, as an engine does."""
    for step in range(3):
        ids = torch.arange(12).reshape(4, 3) % 11
        mine = ids[rank::world] if world > 1 else ids
        net((mine + step) % 11).square().mean().mul(len(mine) / len(ids)).backward()
        for param in net.parameters():
            if world > 1:
                dist.all_reduce(param.grad)
        optim.step()


def _sharded(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        net = model()
        optim = Optimizer(net.parameters(), CFG, total_steps=3, shard_group=dist.group.WORLD)
        steps(net, optim, rank, 2)
        owned = [i for i, p in enumerate(optim.params) if optim.steps_locally(p)]
        assert sorted(i for i, p in enumerate(optim.params) if p in optim.local_state) == owned
        torch.save({"weights": net.state_dict(), "owned": owned}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_sharded_optimizer_steps_as_the_unsharded_one(tmp_path):
    mp.start_processes(_sharded, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    net = model()
    plain = Optimizer(net.parameters(), CFG, total_steps=3)
    steps(net, plain, 0, 1)
    # each rank kept the state of some weights, the two shares are disjoint and cover all of them
    assert ranks[0]["owned"] and ranks[1]["owned"]
    assert sorted(ranks[0]["owned"] + ranks[1]["owned"]) == list(range(len(plain.params)))
    assert len(plain.local_state) == len(plain.params)
    for got in ranks:
        for name, tensor in net.state_dict().items():
            torch.testing.assert_close(got["weights"][name], tensor, atol=1e-6, rtol=1e-6)
