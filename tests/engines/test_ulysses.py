"""Ulysses sequence parallelism (rlplat/engines/ulysses.py): a sequence split over U processes on gloo gives one
unsharded model's per-token log-probs and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlplat.utils.net import free_port
from rlplat.engines.ulysses import ATTENTION, SequenceShard, local_slice, padded_length, register, sharded

LENGTH = 23  # no multiple of 2 or 4: the last rank's slice ends in padding


@pytest.mark.parametrize("extra, message", [
    (["trainer.workers_per_node=3", "rollout.n=3", "actor.fsdp.ulysses_size=2"],
     r"actor.fsdp.ulysses_size=2 splits each sequence over 2 workers, and must divide the 3 workers the actor runs on"),
    (["trainer.workers_per_node=3", "rollout.n=3", "actor.fsdp.ulysses_size=3"],
     r"actor.fsdp.ulysses_size=3: each of the 3 ranks attends with 1/3 of the heads, and the model has 4 attention "
     r"heads"),
    (["trainer.workers_per_node=4", "actor.fsdp.ulysses_size=2", "ref.fsdp.ulysses_size=4", "algorithm.use_kl_loss=true"],
     r"ref.fsdp.ulysses_size=4: a colocated reference splits its sequences over the actor's groups "
     r"\(actor.fsdp.ulysses_size=2\) or none"),
    (["actor.fsdp.ulysses_size=0"], r"actor.fsdp.ulysses_size must be >= 1"),
])
def test_ulysses_sizes_are_checked(extra, message):
    from rlplat.config import ConfigError
    from rlplat.trainer.run import load_run_config

    with pytest.raises(ConfigError, match=message):
        load_run_config(extra)


def _model(attn: str) -> Qwen2ForCausalLM:
    # 4 query heads over 2 key/value heads: at U = 2 each rank gets one key/value head, at U = 4 they are repeated
    config = Qwen2Config(vocab_size=50, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=96, max_position_embeddings=64)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).float()
    model.set_attn_implementation(attn)
    return model


def _batch(packed: bool):
    """Two rows of LENGTH tokens, their position ids and attention mask (None when packed), and a weight per
    predicted token (the loss is their weighted log-probs)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 50, (2, LENGTH), generator=generator)
    if packed:  # sequences of 7, 10 and 6 tokens, then 9, 14: position ids restart at 0 for each
        position_ids = torch.cat([torch.cat([torch.arange(n) for n in lengths])[None]
                                  for lengths in ([7, 10, 6], [9, 14])])
        mask = None
    else:  # left padding before the prompt, right padding after the response
        mask = torch.ones(2, LENGTH, dtype=torch.long)
        mask[0, :5] = 0
        mask[1, -4:] = 0
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    weights = torch.randn(2, LENGTH - 1, generator=generator)
    if mask is not None:
        weights = weights * mask[:, 1:] * mask[:, :-1]
    return ids, position_ids, mask, weights


def _log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None]).squeeze(-1)


def _reference(packed: bool):
    model = _model("sdpa")
    ids, position_ids, mask, weights = _batch(packed)
    logits = model(input_ids=ids, position_ids=position_ids, attention_mask=mask, use_cache=False).logits
    log_probs = _log_probs(logits[:, :-1], ids[:, 1:])
    (log_probs * weights).sum().backward()
    return log_probs.detach(), {name: p.grad for name, p in model.named_parameters()}


def _sharded(rank: int, size: int, port: int, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    try:
        register()
        for packed in (True, False):
            model = _model(ATTENTION)
            ids, position_ids, mask, weights = _batch(packed)
            width = padded_length(LENGTH, size)
            pad = width - LENGTH  # padding tokens: their own sequence (position 0) or masked out
            ids = torch.nn.functional.pad(ids, (0, pad))
            position_ids = torch.nn.functional.pad(position_ids, (0, pad))
            mask = None if mask is None else torch.nn.functional.pad(mask, (0, pad))
            weights = torch.nn.functional.pad(weights, (0, pad + 1))  # [B, width]: the token at t predicts t + 1
            targets = torch.nn.functional.pad(ids[:, 1:], (0, 1))
            with sharded(SequenceShard(dist.group.WORLD, position_ids, mask)):
                logits = model(input_ids=local_slice(ids, rank, size),
                               position_ids=local_slice(position_ids, rank, size), use_cache=False).logits
            log_probs = _log_probs(logits, local_slice(targets, rank, size))
            (log_probs * local_slice(weights, rank, size)).sum().backward()
            for p in model.parameters():  # the group's loss is the sum of its ranks' slices
                dist.all_reduce(p.grad)
            slices = [torch.empty_like(log_probs) for _ in range(size)]
            dist.all_gather(slices, log_probs.detach().contiguous())
            full = torch.cat(slices, dim=1)[:, :LENGTH - 1]
            if rank == 0:
                out[packed] = (full, {name: p.grad for name, p in model.named_parameters()})
    finally:
        dist.destroy_process_group()


def test_a_sequence_split_over_ranks_gives_the_unsharded_log_probs_and_gradients():
    # U = 4: the two key/value heads repeated to the four query heads, 23 tokens padded to 24 (the engine's
    # path, U = 2 as well: the Ray tests below)
    size, out = 4, mp.Manager().dict()
    mp.start_processes(_sharded, args=(size, free_port(), out), nprocs=size, start_method="spawn")
    for packed in (True, False):  # packed rows (sequences told apart by their position ids), padded rows
        log_probs, grads = _reference(packed)
        sharded_log_probs, sharded_grads = out[packed]
        real = torch.ones_like(log_probs, dtype=torch.bool) if packed else _batch(False)[3] != 0
        torch.testing.assert_close(sharded_log_probs[real], log_probs[real], atol=1e-5, rtol=0)
        assert grads.keys() == sharded_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(sharded_grads[name], grad, atol=1e-5, rtol=1e-5, msg=f"{packed=} {name}")


def _engine_step(rank: int, size: int, port: int, model_path: str, folder: str, extra: tuple[str, ...] = ()) -> None:
    """One worker of an actor group with actor.fsdp.ulysses_size = the world (one replica), in a spawned process
    without Ray: each rank gets the whole batch, as the group's dispatch gives a replica's ranks. Saves its
    log-probs of the batch and its update's metrics."""
    from workers.helpers import engine_config

    from rlplat.workers.roles import ActorRolloutRefWorker

    cfg, plan = engine_config(model_path, workers=size, extra=[f"actor.fsdp.ulysses_size={size}", *extra])
    worker = ActorRolloutRefWorker(rank=rank, world_size=size, device="cpu", cfg=cfg, plan=plan)
    worker.setup_distributed(("127.0.0.1", port))
    try:
        worker.init_model(model_path, with_ref=False)
        batch = torch.load(f"{folder}/batch.pt", weights_only=False)
        if extra:
            torch.save(worker.compute_log_probs(batch).tensors["old_log_probs"], f"{folder}/log_probs{rank}.pt")
        metrics = worker.update_actor(batch)
        torch.save(metrics, f"{folder}/metrics{rank}.pt")
    finally:
        worker.close()
        dist.barrier()
        dist.destroy_process_group()


def test_an_engine_splitting_sequences_scales_its_loss_by_the_replicas_not_the_workers(tiny_model_path, tmp_path):
    # FSDP averages the gradients over the 2 workers and every rank of a replica computes the replica's loss: the
    # engine multiplies its loss by the data-parallel size (1), not the world size (2), or the gradient doubles.
    # The engine's own path in 2 spawned gloo processes (the Ray tests below run the whole worker group)
    from workers.helpers import engine_config, prompt_batch, unsharded_step, with_training_fields

    from rlplat.controller import InProcessWorkerGroup
    from rlplat.workers.roles import ActorRolloutRefWorker

    cfg, plan = engine_config(tiny_model_path)
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=False)
        torch.manual_seed(0)
        train = with_training_fields(group.generate_sequences(prompt_batch(tiny_model_path, temperature=1.0)))
    finally:
        group.shutdown()
    torch.save(train, tmp_path / "batch.pt")
    mp.start_processes(_engine_step, args=(2, free_port(), tiny_model_path, str(tmp_path)), nprocs=2,
                       start_method="spawn")
    reference = unsharded_step(tiny_model_path, cfg, train, plan.loss_scale_factor)
    for rank in range(2):
        metrics = torch.load(tmp_path / f"metrics{rank}.pt", weights_only=False)
        assert metrics["grad_norm"] == pytest.approx(reference.grad_norm, rel=1e-5), rank
        assert metrics["actor/pg_loss"] == pytest.approx(reference.metrics["actor/pg_loss"], rel=1e-5, abs=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("pack", [True, False], ids=["packed", "padded"])
def test_ulysses_workers_on_ray_score_and_step_as_one_unsharded_worker(ray_cluster, tiny_model_path, workers, pack):
    """actor.fsdp.ulysses_size = the world (one replica): the log-probs, the entropies, the loss and the gradients
    are one unsharded worker's on the same batch: the gradients' norm before clipping, and each gradient (with
    AdamW's lr and eps at 1000 its first step moves every weight by lr g / (|g| + eps), about its gradient, so the
    weights after the step compare the gradients). The tiny model has 4 query and 2 key/value heads: at U = 4 the
    key/value heads are repeated, and the layers recompute their forward (all-to-alls included) in the backward
    pass (gradient checkpointing)."""
    from transformers import AutoModelForCausalLM

    from rlplat.algorithms import entropy_from_logits
    from rlplat.controller import RayWorkerGroup, ResourcePool
    from rlplat.workers.roles import ActorRolloutRefWorker
    from workers.helpers import engine_config, prompt_batch, reference_log_probs, unsharded_step, with_training_fields

    cfg, plan = engine_config(tiny_model_path, workers=workers, extra=[
        f"actor.fsdp.ulysses_size={workers}", f"actor.fsdp.pack_sequences={pack}", "actor.optim.grad_clip=1e9",
        "actor.optim.lr=1000", "actor.optim.eps=1000", "actor.optim.weight_decay=0",
        f"model.gradient_checkpointing={workers == 4}"])
    pool = ResourcePool(nnodes=1, workers_per_node=workers, device="cpu").create()
    group = RayWorkerGroup(ActorRolloutRefWorker, pool, cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=False)
        assert [layout.dp_size for layout in group.layouts()] == [1] * workers
        torch.manual_seed(0)
        out = group.generate_sequences(prompt_batch(tiny_model_path, temperature=1.0))
        mask = out.tensors["response_mask"].bool()
        assert out.tensors["input_ids"].shape[1] % workers  # the padded rows' width is no multiple of U
        scored = group.compute_log_probs(out, entropy=True)
        plain = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        with torch.no_grad():
            expected = reference_log_probs(plain, out, 1.0)
            logits = plain(input_ids=out.tensors["input_ids"], attention_mask=out.tensors["attention_mask"],
                           position_ids=out.tensors["position_ids"]).logits[:, -mask.shape[1] - 1:-1]
        torch.testing.assert_close(scored.tensors["old_log_probs"][mask], expected[mask], atol=1e-5, rtol=0)
        torch.testing.assert_close(scored.tensors["entropy"][mask], entropy_from_logits(logits.float())[mask],
                                   atol=1e-5, rtol=0)

        train = with_training_fields(out)
        metrics = group.update_actor(train)[0]
        reference = unsharded_step(tiny_model_path, cfg, train, plan.loss_scale_factor)
        assert metrics["grad_norm"] == pytest.approx(reference.grad_norm, rel=1e-5)
        assert metrics["actor/pg_loss"] == pytest.approx(reference.metrics["actor/pg_loss"], rel=1e-5, abs=1e-7)
        per_rank = group.actor_weights()
        initial = plain.state_dict()
        assert max((tensor - initial[name]).abs().max() for name, tensor in reference.weights.items()) > 1e-3
        for name, tensor in reference.weights.items():
            torch.testing.assert_close(per_rank[0][name], tensor, atol=1e-5, rtol=1e-5)
    finally:
        group.shutdown()
        pool.release()


@pytest.mark.slow
def test_a_ulysses_critic_values_and_updates_as_one_unsharded_worker(ray_cluster, tiny_model_path):
    """critic.fsdp.ulysses_size=2 on 2 Ray workers: the values of a batch, the value loss of an update and the
    values after it are one in-process critic's."""
    from rlplat.controller import InProcessWorkerGroup, RayWorkerGroup, ResourcePool
    from rlplat.rollout.base import assemble_rollout
    from rlplat.workers.roles import CriticWorker
    from workers.helpers import engine_config, prompt_batch

    rollout = prompt_batch(tiny_model_path)
    responses = torch.randint(10, 20, (len(rollout), 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(len(rollout), 8, dtype=torch.long)
    mask[0, 5:] = 0
    batch = assemble_rollout(rollout, responses, mask, torch.zeros(len(rollout), 8))
    results = []
    for workers in (1, 2):
        cfg, plan = engine_config(tiny_model_path, workers=workers, extra=[
            "algorithm=ppo", "critic.optim.lr=3e-3", f"critic.fsdp.ulysses_size={workers}"])
        pool = ResourcePool(nnodes=1, workers_per_node=workers, device="cpu").create() if workers > 1 else None
        group = (RayWorkerGroup(CriticWorker, pool, cfg=cfg, plan=plan) if pool else
                 InProcessWorkerGroup(CriticWorker, device="cpu", cfg=cfg, plan=plan))
        try:
            group.init_model(tiny_model_path)
            values = group.compute_values(batch).tensors["values"]
            train = batch.union(type(batch).from_dict({"values": values, "returns": torch.ones(8, 8) * mask}))
            loss = group.update_critic(train)[0]["critic/vf_loss"]
            results.append((values, loss, group.compute_values(batch).tensors["values"]))
        finally:
            group.shutdown()
            if pool:
                pool.release()
    (values, loss, after), (split_values, split_loss, split_after) = results
    torch.testing.assert_close(split_values, values, atol=1e-5, rtol=0)
    assert split_loss == pytest.approx(loss, rel=1e-5)
    assert (after - values).abs().max() > 1e-3  # the update moved the values ...
    torch.testing.assert_close(split_after, after, atol=1e-5, rtol=0)  # ... alike


def test_a_mixture_of_experts_split_by_ulysses_routes_as_one_worker(tmp_path):
    """U = 2 on a Qwen3-MoE with r3: each rank replays its slice of the rollout's routing, and the slices' routing
    is joined for the load-balancing loss and the metrics, so log-probs, pg loss, aux loss, routing metrics and the
    gradient norm are one unsharded worker's."""
    from workers.helpers import engine_config, prompt_batch, with_training_fields

    from rlplat.controller import InProcessWorkerGroup
    from rlplat.models.tiny import TinyMoESpec, build_tiny_model
    from rlplat.workers.roles import ActorRolloutRefWorker

    model_path = str(build_tiny_model(tmp_path / "moe", TinyMoESpec(), seed=0))
    extra = ("actor.moe.aux_loss_coef=0.5", "actor.moe.router_replay=r3")
    cfg, plan = engine_config(model_path, extra=list(extra))
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(model_path, with_ref=False)
        torch.manual_seed(0)
        train = with_training_fields(group.generate_sequences(prompt_batch(model_path, temperature=1.0)))
        log_probs = group.compute_log_probs(train).tensors["old_log_probs"]
        reference = group.update_actor(train)[0]
    finally:
        group.shutdown()
    assert train.tensors["input_ids"].shape[1] % 2  # the rows' width is no multiple of U
    torch.save(train, tmp_path / "batch.pt")
    mp.start_processes(_engine_step, args=(2, free_port(), model_path, str(tmp_path), extra), nprocs=2,
                       start_method="spawn")
    mask = train.tensors["response_mask"].bool()
    for rank in range(2):
        got = torch.load(tmp_path / f"log_probs{rank}.pt")
        torch.testing.assert_close(got[mask], log_probs[mask], atol=1e-5, rtol=0)
        metrics = torch.load(tmp_path / f"metrics{rank}.pt", weights_only=False)
        for key in ("grad_norm", "actor/pg_loss", "moe/aux_loss", "moe/expert_load_max_frac", "moe/routing_entropy",
                    "moe/routing_mismatch_frac", "moe/router_mismatch_frac"):
            assert metrics[key] == pytest.approx(reference[key], rel=1e-5, abs=1e-6), (rank, key)
