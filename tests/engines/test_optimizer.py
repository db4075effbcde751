"""The optimizer sharded over data-parallel replicas (Megatron's distributed optimizer, ZeRO-1): two gloo
processes each keep AdamW's state for a share of the weights, and their steps equal the unsharded AdamW's;
with bf16 weights, each keeps the fp32 master copies of its share only, and the steps are the unsharded
master-weight optimizer's exactly."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from rlplat.utils.net import free_port
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
                dist.all_reduce(optim.grad(param))  # bf16 weights: the fp32 main gradient
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
        # bf16 weights through fp32 masters, sharded and not: the same gradients, the same steps
        bf16 = {}
        for shard_group in (dist.group.WORLD, None):
            net16 = model().bfloat16()
            optim16 = Optimizer(net16.parameters(), CFG, total_steps=3, shard_group=shard_group, master_weights=True)
            steps(net16, optim16, rank, 2)
            held = {i for i, p in enumerate(optim16.params) if p in optim16.masters}
            bf16[shard_group is not None] = net16.state_dict(), held
            assert all(m.dtype == torch.float32 and torch.equal(p, m.bfloat16()) for p, m in optim16.masters.items())
        torch.save({"weights": net.state_dict(), "owned": owned, "bf16": bf16}, f"{out}/rank{rank}.pt")
    finally:
        dist.barrier()  # gloo aborts at exit now and then (std::terminate) when one rank tears down first
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
    # bf16: each rank held the masters of its share (the fp32 shares'), and stepped as the unsharded optimizer
    for rank, got in enumerate(ranks):
        (sharded, mine), (unsharded, every) = got["bf16"][True], got["bf16"][False]
        assert sorted(mine) == got["owned"] and every == set(range(len(plain.params)))
        for name, tensor in unsharded.items():
            assert tensor.dtype == torch.bfloat16 and torch.equal(sharded[name], tensor), name
        assert any(not torch.equal(tensor, model().bfloat16().state_dict()[name]) for name, tensor in sharded.items())


def test_flat_gradients_and_moments_step_as_separate_tensors():
    """Gradients kept as views of one buffer (added into and zeroed each step) and AdamW's moments as views
    of another give the same weights as gradients allocated anew by each backward pass and moments
    created by the first step."""
    fresh, flat = model(), model()
    plain_optim = Optimizer(fresh.parameters(), CFG, total_steps=3)
    flat_optim = Optimizer(flat.parameters(), CFG, total_steps=3, flat_state=True)
    assert plain_optim.grad_buffer is None
    buffer = flat_optim.grad_buffer
    assert buffer.numel() == sum(p.numel() for p in flat.parameters())
    assert all(p.grad.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr() for p in flat.parameters())
    moments = {state[key].untyped_storage().data_ptr() for state in flat_optim.local_state.values()
               for key in ("exp_avg", "exp_avg_sq")}
    assert len(flat_optim.local_state) == len(flat_optim.params) and len(moments) == 1  # one buffer for both
    steps(fresh, plain_optim, 0, 1)
    steps(flat, flat_optim, 0, 1)
    for (name, a), b in zip(fresh.state_dict().items(), flat.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
    assert buffer.abs().sum() == 0  # zeroed after the step, the views still in place
    assert all(p.grad.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr() for p in flat.parameters())
    assert {state["exp_avg"].untyped_storage().data_ptr() for state in flat_optim.local_state.values()} == moments


def test_flat_gradients_only_for_plain_tensors_of_one_dtype():
    net = model()
    net[2].double()
    assert Optimizer(net.parameters(), CFG, total_steps=1, flat_state=True).grad_buffer is None
    assert all(p.grad is None for p in net.parameters())


def test_bf16_weights_sum_their_gradients_in_fp32():
    """256 micro-batches each adding 1e-3 to a bf16 weight's gradient: summed in bf16 each addition rounds to
    bf16's spacing (2^-10 above 0.125), and the sum ends at 0.252; the fp32 main gradient holds 0.2561."""
    weight = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    optim = Optimizer([weight], CFG, total_steps=1, master_weights=True)
    plain = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    for _ in range(256):
        (weight * 1e-3).sum().backward()
        (plain * 1e-3).sum().backward()
    assert weight.grad is None and optim.grad(weight).dtype == torch.float32
    each = torch.tensor(1e-3, dtype=torch.bfloat16).float()  # one micro-batch's gradient, as bf16 holds it
    torch.testing.assert_close(optim.grad(weight), torch.full((4,), 256 * float(each)), atol=1e-6, rtol=0)
    assert abs(float(plain.grad[0]) - 256 * float(each)) > 3e-3  # what summing in bf16 gives
    optim.step()
    assert optim.grad(weight) is None and weight.dtype == torch.bfloat16 and float(weight[0]) < 1
