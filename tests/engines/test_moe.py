"""Mixtures of experts on the FSDP engine: the routers' load-balancing loss (transformers' own formula), the
routing metrics, the loss's gradient reaching the routers, packed rows routing as padded ones, and what is
refused at start-up (rlplat.models.moe)."""

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from rlplat.config.errors import ConfigError
from rlplat.controller import InProcessWorkerGroup
from rlplat.models.moe import RouterTap, find_routers, load_balancing_loss, routing_metrics
from rlplat.models.tiny import TinyMoESpec, build_tiny_model
from rlplat.trainer.run import load_run_config
from rlplat.workers.roles import ActorRolloutRefWorker

from workers.helpers import engine_config, prompt_batch, with_training_fields


@pytest.fixture(scope="module")
def tiny_moe_path(tmp_path_factory):
    """A randomly initialised tiny Qwen3-MoE (2 layers, 8 experts, top-2) with its tokenizer."""
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-moe"), TinyMoESpec(), seed=0))


def test_the_load_balancing_loss_is_transformers_own_over_the_real_tokens(tiny_moe_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_moe_path, dtype=torch.float32)
    tap = RouterTap(model, aux_loss_coef=1.0)
    assert len(tap.routers) == len(find_routers(model)) == 2 and (tap.num_experts, tap.top_k) == (8, 2)
    ids = torch.randint(7, 100, (4, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :5] = mask[3, :2] = 0  # left padding
    with torch.no_grad(), tap.recording() as routing:
        out = model(ids, attention_mask=mask, output_router_logits=True)
    expected = load_balancing_loss_func(out.router_logits, 8, 2, mask)
    ours = load_balancing_loss(routing, mask.reshape(-1).bool(), 8)
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)
    assert not torch.allclose(ours, load_balancing_loss(routing, torch.ones(48, dtype=torch.bool), 8))  # padding counts
    metrics = routing_metrics(routing, mask.reshape(-1).bool(), 8)
    assert 1 / 8 <= metrics["moe/expert_load_max_frac"] <= 1 / 2
    assert 0 < metrics["moe/routing_entropy"] <= torch.log(torch.tensor(8.0)).item() + 1e-6
    with torch.no_grad():  # a forward outside recording() records nothing (a checkpointed layer's recomputation)
        model(ids)
    assert routing.logits[0].shape == (48, 8)


def test_the_update_adds_the_load_balancing_loss_and_reports_the_routing(tiny_moe_path):
    cfg, plan = engine_config(tiny_moe_path, extra=["actor.moe.aux_loss_coef=0.5"])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    group.init_model(tiny_moe_path, with_ref=True)
    try:
        engine = group.worker.actor
        assert engine.router_tap.aux_loss_coef == 0.5 and group.worker.ref.router_tap is None  # the actor's only
        torch.manual_seed(0)
        batch = with_training_fields(group.generate_sequences(prompt_batch(tiny_moe_path)))
        assert engine.pack_sequences
        packed = engine.forward(batch, grad=True)
        engine.pack_sequences = False
        padded = engine.forward(batch, grad=True)
        engine.pack_sequences = True
        # the same real tokens routed, so the same loss and metrics, whatever the padding
        torch.testing.assert_close(packed.router_loss, padded.router_loss, atol=1e-6, rtol=0)
        assert packed.router_metrics == pytest.approx(padded.router_metrics, abs=1e-6)
        assert packed.router_metrics["moe/aux_loss"] == pytest.approx(float(packed.router_loss.detach()) / 0.5)
        assert engine.forward(batch).router_loss is None  # no-grad passes (log-probs) do not record
        packed.router_loss.backward()
        routers = find_routers(engine.model)
        assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in routers)
        engine.model.zero_grad(set_to_none=True)
        before = [r.weight.detach().clone() for r in routers]
        metrics = group.update_actor(batch)[0]
        assert set(metrics) >= {"moe/aux_loss", "moe/expert_load_max_frac", "moe/routing_entropy"}
        assert 1.5 < metrics["moe/aux_loss"] < 4 and metrics["moe/routing_entropy"] > 1
        assert all(not torch.equal(b, r.weight) for b, r in zip(before, routers))
    finally:
        group.shutdown()


def test_the_coefficient_defaults_to_the_model_configs(tiny_moe_path):
    cfg, plan = engine_config(tiny_moe_path)
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    group.init_model(tiny_moe_path, with_ref=False)
    try:
        assert cfg.actor.moe.aux_loss_coef is None
        assert group.worker.actor.router_tap.aux_loss_coef == TinyMoESpec().router_aux_loss_coef == 0.001
    finally:
        group.shutdown()


@pytest.mark.parametrize("extra, message", [
    (["actor.strategy=megatron"], r"actor.strategy=megatron: model.path=embedded-moe is a mixture of experts, "
                                  r"which this engine does not train yet; use actor.strategy=fsdp"),
    (["trainer.workers_per_node=2", "actor.fsdp.ulysses_size=2"],
     r"actor.fsdp.ulysses_size=2: Ulysses sequence parallelism does not split the routing of a mixture of experts"),
])
def test_what_mixtures_of_experts_cannot_run_yet_is_one_line_at_start_up(extra, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(["model.path=embedded-moe", *extra])
