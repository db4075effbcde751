"""A Qwen3-MoE on the Megatron engine: its experts convert to Megatron-Core and back bit for bit at any tensor x
expert-parallel layout; the engine's log-probs, load-balancing loss, routing metrics and update equal the FSDP
engine's in one process, with the experts split over two gloo ranks (EP = 2) or four (TP = 2 x EP = 2), and with the
layers over two pipeline stages (PP = 2); Megatron-Core's RouterReplay hook replays the Hugging Face rollout's
routing; bad expert settings are one line."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlplat.config import ConfigError
from rlplat.controller import InProcessWorkerGroup, RayWorkerGroup, ResourcePool
from rlplat.engines.megatron.convert import (EXPERTS, LOCAL_EXPERT, GPTShape, hf_from_megatron, hf_sources,
                                             hf_split_dim, megatron_from_hf, megatron_name, piece_of)
from rlplat.models.tiny import TinyMoESpec, build_tiny_model
from rlplat.trainer.run import load_run_config
from rlplat.workers.roles import ActorRolloutRefWorker
from workers.helpers import engine_config, prompt_batch, with_training_fields

pytest.importorskip("megatron.core", reason="needs megatron-core (pip install -e '.[megatron]')")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    """A randomly initialised tiny Qwen3-MoE (2 layers, 8 experts, top-2, q/k norms, tied embeddings)."""
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-moe"), TinyMoESpec(), seed=0))


# ------------------------------------------------------------------------------------------------- conversion
def megatron_names(hf: dict[str, torch.Tensor], shape: GPTShape, ep: int) -> list[str]:
    """A stage's Megatron tensors, each local expert named (``*`` in :func:`megatron_name`)."""
    names = dict.fromkeys(megatron_name(name) for name in hf if not (name == "lm_head.weight" and shape.tied_embeddings))
    return [n.replace("*", str(j)) for n in names for j in (range(shape.num_experts // ep) if "*" in n else [0])]


def to_megatron(hf, shape: GPTShape, tp: int, ep: int) -> dict[tuple[int, int], dict[str, torch.Tensor]]:
    """Each (tensor-parallel rank, expert-parallel rank)'s Megatron tensors, from its pieces."""
    names = megatron_names(hf, shape, ep)
    return {(t, e): {n: x.clone() for n, x in megatron_from_hf(
        {name: piece_of(name, x, tp, t, ep, e) for name, x in hf.items()}, shape, tp, t, names).items()}
        for t in range(tp) for e in range(ep)}


def to_hf(shards, shape: GPTShape, tp: int, ep: int) -> dict[str, torch.Tensor]:
    """The whole Hugging Face state dict back: tensor-parallel pieces joined over tp, the experts over ep."""
    pieces = {rank: hf_from_megatron(shard, shape, tp, rank[0]) for rank, shard in shards.items()}
    out = {}
    for name, tensor in pieces[0, 0].items():
        if EXPERTS in name:
            out[name] = torch.cat([pieces[0, e][name] for e in range(ep)])
        elif (dim := hf_split_dim(name)) is not None:
            out[name] = torch.cat([pieces[t, 0][name] for t in range(tp)], dim)
        else:
            out[name] = tensor
    return out


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("tp, ep", [(1, 1), (2, 2), (1, 4)])
def test_a_qwen3_moe_checkpoint_round_trips_bit_exactly(tmp_path, tied, tp, ep):
    """HF -> Megatron -> HF of the checkpoint's own tensors, split and merged; expert-parallel rank e holds the
    experts e E / ep ... as its local experts 0 ..., each expert's [gate; up] in one linear_fc1."""
    path = build_tiny_model(tmp_path / "moe", TinyMoESpec(tie_word_embeddings=tied), seed=1)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    hf = {n: t for n, t in model.state_dict().items() if not (tied and n == "lm_head.weight")}
    shape = GPTShape.from_hf_config(AutoConfig.from_pretrained(path))
    assert (shape.num_experts, shape.top_k, shape.sparse_layers, shape.qk_norm) == (8, 2, (0, 1), True)
    shards = to_megatron(hf, shape, tp, ep)
    local = 8 // ep
    fc1 = shards[0, ep - 1][f"decoder.layers.1.{LOCAL_EXPERT}{local - 1}.linear_fc1.weight"]
    assert torch.equal(fc1, hf["model.layers.1.mlp.experts.gate_up_proj"][7])  # the last expert, on the last rank
    assert not any(f"{LOCAL_EXPERT}{local}." in name for name in shards[0, 0])
    back = to_hf(shards, shape, tp, ep)
    assert back.keys() == hf.keys()
    assert all(torch.equal(back[name], tensor) for name, tensor in hf.items())
    # the reference blend's bookkeeping: every local expert is built from its layer's fused tensors
    sources = hf_sources(megatron_names(hf, shape, ep), list(model.state_dict()), shape)
    assert sources[f"decoder.layers.0.{LOCAL_EXPERT}0.linear_fc2.weight"] == {"model.layers.0.mlp.experts.down_proj"}
    assert sources["decoder.layers.0.mlp.router.weight"] == {"model.layers.0.mlp.gate.weight"}


# ------------------------------------------------------------------------------------------------- the engine
def megatron(tp: int = 1, ep: int = 1, sharded: bool = False, pp: int = 1) -> list[str]:
    return ["actor.strategy=megatron", f"actor.megatron.tensor_model_parallel_size={tp}",
            f"actor.megatron.expert_model_parallel_size={ep}", f"actor.megatron.sequence_parallel={tp > 1}",
            f"actor.megatron.use_distributed_optimizer={sharded}", f"actor.megatron.pipeline_model_parallel_size={pp}"]


def with_recorded_routing(batch, scored):
    """``batch`` with the log-probs and routing of its log-prob pass ``scored`` when it recorded one (r2: the update
    replays it)."""
    recorded = "old_routed_experts" in scored.tensors
    return batch.union(scored.select(["old_log_probs", "old_routed_experts"])) if recorded else batch


def fsdp_step(model_path: str, extra: list[str]):
    """The FSDP engine's rollout (with its routing), log-probs, update metrics and trained weights: the reference."""
    cfg, plan = engine_config(model_path, extra=extra)
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    group.init_model(model_path, with_ref=False)
    try:
        torch.manual_seed(0)
        batch = with_training_fields(group.generate_sequences(prompt_batch(model_path)))
        scored = group.compute_log_probs(batch)
        batch = with_recorded_routing(batch, scored)
        metrics = group.update_actor(batch)[0]
        log_probs = scored.tensors["old_log_probs"]
        return batch, log_probs, metrics, group.actor_weights()[0]
    finally:
        group.shutdown()


def check_same_step(group, reference) -> None:
    """``group`` (a Megatron actor) scores and trains ``reference``'s batch as the FSDP engine did."""
    batch, log_probs, metrics, weights = reference
    mask = batch.tensors["response_mask"].bool()
    scored = group.compute_log_probs(batch)
    torch.testing.assert_close(scored.tensors["old_log_probs"][mask], log_probs[mask], atol=1e-5, rtol=0)
    if "old_routed_experts" in batch.tensors:  # r2: the log-prob pass recorded the experts it used, every layer's
        assert torch.equal(scored.tensors["old_routed_experts"], batch.tensors["old_routed_experts"])
    trained = group.update_actor(batch)[0]
    for key in ("actor/pg_loss", "moe/aux_loss", "moe/expert_load_max_frac", "moe/routing_entropy",
                "moe/routing_mismatch_frac", "moe/router_mismatch_frac", "grad_norm"):
        assert trained[key] == pytest.approx(metrics[key], abs=1e-5), key
    for rank_weights in group.actor_weights():
        assert rank_weights.keys() == weights.keys()
        for name, tensor in weights.items():
            torch.testing.assert_close(rank_weights[name], tensor, atol=1e-5, rtol=1e-5, msg=name)


AUX = ["actor.moe.aux_loss_coef=0.5", "actor.moe.router_replay=r3"]  # a loss that weighs; the rollout's routing


def test_in_process_megatron_moe_replays_the_rollouts_routing_and_matches_fsdp(moe_path):
    """EP = 1. The trainer's routers moved after the rollout sampled: the forward's experts differ from the rollout's
    without replay, not with r3 (through Megatron-Core's RouterReplay hook), and the log-probs come closer to the
    rollout's. Unmoved: the same log-probs, losses, metrics and step as the FSDP engine under r3."""
    reference = fsdp_step(moe_path, AUX)
    batch = reference[0]
    cfg, plan = engine_config(moe_path, extra=[*AUX, *megatron()])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    group.init_model(moe_path, with_ref=False)
    try:
        engine = group.worker.actor
        assert type(engine).__name__ == "MegatronEngine" and engine.routing.tap.aux_loss_coef == 0.5
        mask = batch.tensors["response_mask"].bool()

        def trained(replay: str):
            engine.routing.replay = replay
            out = engine.forward(batch, grad=True)
            return out.router_metrics["moe/routing_mismatch_frac"], (out.log_probs - batch.tensors["rollout_log_probs"])[mask]

        assert trained("none")[0] == 0  # the rollout's weights route as it did
        routers = engine.routing.tap.routers
        saved = [router.weight.detach().clone() for router in routers]
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for router in routers:
                router.weight.add_(torch.randn(router.weight.shape, generator=gen) * 0.3)
        mismatch_none, gap_none = trained("none")
        mismatch_r3, gap_r3 = trained("r3")
        print(f"megatron: routing mismatch none {mismatch_none:.3f} r3 {mismatch_r3:.3f}; mean |log-prob gap| "
              f"none {gap_none.abs().mean():.4f} r3 {gap_r3.abs().mean():.4f}")
        assert mismatch_none > 0.1 and mismatch_r3 == 0
        assert gap_r3.abs().mean() < 0.75 * gap_none.abs().mean()
        with torch.no_grad():
            for router, weight in zip(routers, saved):
                router.weight.copy_(weight)
        engine.routing.replay = "r2"  # the log-prob pass records its routing: the rollout's, on these weights
        recorded, rollout = group.compute_log_probs(batch).tensors["old_routed_experts"], batch.tensors["routed_experts"]
        assert recorded.dtype == torch.int16 and torch.equal(recorded[rollout >= 0], rollout[rollout >= 0])
        assert bool((recorded[~batch.tensors["attention_mask"].bool()] == -1).all())
        engine.routing.replay = "r3"
        check_same_step(group, reference)
    finally:
        group.shutdown()


def test_recomputed_layers_add_the_load_balancing_loss_as_fsdp(moe_path):
    """With recomputed activations the forward whose graph the backward runs is the recomputation: the routers'
    loss still reaches them (from a counting pass; without it the gradient norm falls short of FSDP's)."""
    reference = fsdp_step(moe_path, AUX)
    cfg, plan = engine_config(moe_path, extra=[*AUX, *megatron(), "actor.megatron.recompute_activations=true"])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(moe_path, with_ref=False)
        check_same_step(group, reference)
    finally:
        group.shutdown()


@pytest.mark.parametrize("tp, ep, pp, workers", [(1, 2, 1, 2), (2, 2, 1, 4), (1, 1, 2, 2)],
                         ids=["ep2", "tp2-ep2-sharded", "pp2-r2-recomputed"])
def test_experts_split_over_ray_workers_match_fsdp(ray_cluster, moe_path, tmp_path, tp, ep, pp, workers):
    """ep2: each of two workers holds 4 experts (and is a data-parallel replica of the rest); tp2-ep2-sharded: four
    workers, attention split in two with sequence parallelism, the experts over the other axis, and the distributed
    optimizer (each of the two ranks holding an expert steps half of those; each data-parallel replica half of the
    rest); pp2-r2-recomputed: a layer on each of two pipeline stages, replaying r2's routing (the log-prob pass's,
    recorded on both stages), the load-balancing loss pooled over both stages' layers, each layer recomputed in the
    backward pass (after the stage ran the next micro-batch's forward: 1F1B) as its forward routed. Log-probs,
    losses, metrics and every trained weight equal the FSDP engine's (EP = 1) within 1e-5; the checkpoint, each
    rank's experts a slice of the whole tensors, loads into one worker (EP = 1) as those weights."""
    aux = AUX if pp == 1 else ["actor.moe.aux_loss_coef=0.5", "actor.moe.router_replay=r2"]
    reference = fsdp_step(moe_path, aux)
    recomputed = [f"actor.megatron.recompute_activations={pp > 1}"]
    cfg, plan = engine_config(moe_path, workers=workers,
                              extra=[*aux, *megatron(tp, ep, sharded=tp > 1, pp=pp), *recomputed])
    pool = ResourcePool(nnodes=1, workers_per_node=workers, device="cpu").create()
    group = RayWorkerGroup(ActorRolloutRefWorker, pool, cfg=cfg, plan=plan)
    try:
        group.init_model(moe_path, with_ref=False)
        check_same_step(group, reference)
        group.save_checkpoint(str(tmp_path / "ckpt"))
    finally:
        group.shutdown()
        pool.release()
    cfg, plan = engine_config(moe_path, extra=[*aux, *megatron()])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    group.init_model(moe_path, with_ref=False)
    try:
        group.load_checkpoint(str(tmp_path / "ckpt"))
        loaded = group.actor_weights()[0]
        for name, tensor in reference[3].items():
            torch.testing.assert_close(loaded[name], tensor, atol=1e-5, rtol=1e-5, msg=name)
    finally:
        group.shutdown()


@pytest.mark.parametrize("extra, message", [
    (["trainer.workers_per_node=16", *megatron(ep=16)], "actor.megatron: expert parallel size 16 must divide the 8 "
                                                         "experts"),
    ([*megatron(tp=2), "actor.megatron.sequence_parallel=false"],
     "actor.megatron: tensor_model_parallel_size=2 with a mixture of experts needs sequence_parallel=true"),
    # replicas' micro-batches of other shapes: the all-gather over the expert-parallel ranks crashed a worker
    ([*megatron(ep=2), "actor.micro_batch_max_tokens_per_worker=31"],
     "actor.micro_batch_max_tokens_per_worker=31 with actor.megatron.expert_model_parallel_size=2 on cpu: the "
     "experts' tokens are all-gathered"),
])
def test_bad_expert_settings_are_one_config_line(extra, message):
    with pytest.raises(ConfigError) as err:
        load_run_config(["model.path=embedded-moe", "trainer.workers_per_node=4", *extra])
    assert str(err.value).startswith(message), str(err.value)


def test_expert_parallelism_on_a_dense_model_is_one_config_line():
    with pytest.raises(ConfigError, match=r"expert parallel size 2 must divide the 1 experts of each sparse layer "
                                          r"\(a dense model has none: use 1\)"):
        load_run_config(["trainer.workers_per_node=2", *megatron(ep=2)])


def test_the_plan_shares_each_experts_optimizer_state_over_the_ranks_holding_it(moe_path):
    """TP 2 x EP 2 on four workers: a rank holds half of the attention and 4 of each layer's 8 experts; with the
    distributed optimizer it keeps AdamW's state of half of those (its data-parallel replica's share of the rest,
    its expert-data-parallel pair's share of its experts), without it of all it holds."""
    from transformers import AutoConfig

    from rlplat.engines.megatron import memory
    from rlplat.models.shape import ModelShape

    shape = ModelShape.from_config(AutoConfig.from_pretrained(moe_path))
    experts = memory.expert_params(shape)
    assert 0 < experts < shape.params
    held = (shape.params - experts) / 2 + experts / 2  # TP 2 of the rest, EP 2 of the experts
    for sharded in (False, True):
        cfg = load_run_config(["model.path=embedded-moe", "trainer.workers_per_node=4",
                               *megatron(tp=2, ep=2, sharded=sharded)])[0]
        lay = memory.layout(cfg.actor.megatron, replicas=2)
        parts = memory.state(shape, cfg, "actor", lay, trained=True)
        assert parts["actor expert weights, 4 of 8 per layer (fp32)"] == pytest.approx(4 * experts / 2)
        assert parts["actor gradients (fp32)"] == pytest.approx(4 * held)
        assert parts["actor AdamW moments (fp32)"] == pytest.approx(8 * held / (2 if sharded else 1))
