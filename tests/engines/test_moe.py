"""Mixtures of experts on the FSDP engine: the routers' load-balancing loss (transformers' own formula), the
routing metrics, the loss's gradient reaching the routers, packed rows routing as padded ones, routing replay
(the HF rollout's routing in r3, the log-prob pass's in r2, through gradient checkpointing), and what is
refused at start-up (rlplat.models.moe, rlplat.engines.routing)."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from rlplat.config.errors import ConfigError
from rlplat.controller import InProcessWorkerGroup
from rlplat.engines import MicroBatching
from rlplat.models.moe import RouterTap, find_routers, load_balancing_loss, routing_metrics
from rlplat.models.tiny import TinyMoESpec, build_tiny_model
from rlplat.trainer.run import load_run_config
from rlplat.workers.roles import ActorRolloutRefWorker

from workers.helpers import ECHO_ENVIRONMENT, agent_prompts, engine_config, prompt_batch, with_training_fields


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
    recorded = routing.logits[0]
    with torch.no_grad():  # a forward outside recording() records nothing (a checkpointed layer's recomputation)
        model(ids[:2])
    assert routing.logits[0] is recorded


def test_the_rollout_engines_get_the_experts_as_a_checkpoint_holds_them(tiny_moe_path):
    from safetensors.torch import load_file

    from rlplat.models.moe import checkpoint_layout

    model = AutoModelForCausalLM.from_pretrained(tiny_moe_path, dtype=torch.float32)
    held = dict(model.state_dict())
    assert held["model.layers.0.mlp.experts.gate_up_proj"].shape == (8, 256, 128)  # transformers fuses them
    checkpoint = load_file(next(iter(Path(tiny_moe_path).glob("*.safetensors"))))  # one tensor per expert
    converted = dict(checkpoint_layout(list(held.items())))
    assert set(converted) - {"lm_head.weight"} == set(checkpoint)  # the tied head is named either way
    for name, tensor in checkpoint.items():
        assert torch.equal(converted[name], tensor), name


def _tiny(kind: str):
    """A randomly initialised tiny model of another MoE family (and a dense one), from its config."""
    import transformers

    small = dict(vocab_size=100, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=96, eos_token_id=1, bos_token_id=2, pad_token_id=0)
    families = {"Mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
                "Qwen2Moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                 shared_expert_intermediate_size=48, mlp_only_layers=[1]),
                "Olmoe": dict(num_experts=4, num_experts_per_tok=2), "Qwen2": {}}
    config = getattr(transformers, f"{kind}Config")(**small, **families[kind])
    torch.manual_seed(0)
    return getattr(transformers, f"{kind}ForCausalLM")(config).eval()


@pytest.mark.parametrize("kind", ["Mixtral", "Qwen2Moe", "Olmoe", "Qwen2"])
def test_the_plans_shape_counts_the_parameters_of_each_family(kind):
    from rlplat.models.shape import ModelShape

    model = _tiny(kind)
    assert ModelShape.from_config(model.config).params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("kind", ["Mixtral", "Qwen2Moe", "Olmoe"])
def test_replaying_a_models_own_routing_changes_nothing(kind):
    """Each family's gates (renormalised over the chosen experts or not) are rebuilt exactly by replay."""
    model = _tiny(kind)
    tap = RouterTap(model, aux_loss_coef=0.0)
    ids = torch.randint(3, 100, (3, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), tap.recording() as routing:
        own = model(ids).logits
    tap.replay = routing.stacked()
    with torch.no_grad():
        replayed = model(ids).logits
    torch.testing.assert_close(replayed, own, atol=1e-6, rtol=0)
    tap.replay = routing.stacked().roll(1, dims=-1)  # the same experts in another order: the same sets
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, own, atol=1e-5, rtol=0)


def test_a_router_whose_gates_are_not_softmax_probabilities_is_refused():
    class SigmoidTopKRouter(torch.nn.Module):
        top_k, num_experts = 2, 4

        def forward(self, hidden):
            logits = hidden[..., :4]
            weights, indices = torch.sigmoid(logits).topk(2, dim=-1)
            return logits, weights, indices

    model = torch.nn.Sequential(SigmoidTopKRouter())
    RouterTap(model, aux_loss_coef=0.0)
    with pytest.raises(ValueError, match="SigmoidTopKRouter's gate weights are not the softmax probabilities"):
        model(torch.randn(5, 8))


def test_joined_rollouts_pad_the_routing_with_no_routing():
    from rlplat.protocol import Batch
    from rlplat.rollout.base import assemble_rollout, join_rollouts

    def generated(width: int) -> Batch:
        prompts = Batch.from_dict({"prompts": torch.ones(2, width, dtype=torch.long),
                                   "prompt_mask": torch.ones(2, width, dtype=torch.long)})
        out = assemble_rollout(prompts, torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long),
                               torch.zeros(2, 3))
        return out.union(Batch.from_dict({"routed_experts": torch.full((2, width + 3, 2, 2), 5, dtype=torch.int16)}))

    joined = join_rollouts([generated(2), generated(4)], pad_token_id=0).tensors["routed_experts"]
    assert joined.shape == (4, 7, 2, 2)
    assert bool((joined[:2, :2] == -1).all()) and bool((joined[:2, 2:] == 5).all()) and bool((joined[2:] == 5).all())


def test_the_rollout_routes_only_the_tokens_it_feeds(tiny_moe_path):
    """Rows stop at different steps (here at any of 10 stop tokens) and a stopped row stays in the batch until a
    quarter of the rows have stopped, fed a padding token: only real tokens carry routing, every one a forward read
    has it, and the weight sync's probe (no rollout routing) routes on its own under r3."""
    from rlplat.rollout.base import SamplingParams

    group = _moe_group(tiny_moe_path, ["actor.moe.router_replay=r3"])
    try:
        torch.manual_seed(0)
        params = SamplingParams(max_new_tokens=8, stop_token_ids=tuple(range(20, 30)))
        t = group.worker.rollout.generate(prompt_batch(tiny_moe_path).repeat(4), params).tensors
        lengths = t["response_mask"].sum(-1)
        assert lengths.min() < lengths.max() and int((lengths < 8).sum()) > 8  # rows stopped, at different steps
        real = t["attention_mask"].bool()
        fed = real.clone()  # every real token but each row's last (which a stopped row may still feed)
        fed[torch.arange(len(fed)), fed.shape[1] - 1 - fed.flip(1).long().argmax(1)] = False
        routed = t["routed_experts"]
        assert bool((routed[fed] >= 0).all()) and bool((routed[~real] == -1).all())
        assert len(group.worker._sequence_log_probs(t["input_ids"][0][real[0]].tolist())) == int(real[0].sum()) - 1
    finally:
        group.shutdown()


def test_the_plans_shape_counts_all_and_active_parameters(tiny_moe_path):
    from transformers import AutoConfig

    from rlplat.models.shape import ModelShape

    model = AutoModelForCausalLM.from_pretrained(tiny_moe_path, dtype=torch.float32)
    shape = ModelShape.from_config(AutoConfig.from_pretrained(tiny_moe_path))
    assert shape.params == sum(p.numel() for p in model.parameters())
    expert_weights = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    assert shape.active_params == shape.params - expert_weights * (8 - 2) // 8  # 2 of each layer's 8 experts
    assert shape.mlp_width == 2 * TinyMoESpec().moe_intermediate_size


def test_the_update_adds_the_load_balancing_loss_and_reports_the_routing(tiny_moe_path):
    cfg, plan = engine_config(tiny_moe_path, extra=["actor.moe.aux_loss_coef=0.5"])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    group.init_model(tiny_moe_path, with_ref=True)
    try:
        engine = group.worker.actor
        assert engine.routing.tap.aux_loss_coef == 0.5 and engine.routing.trained
        assert not group.worker.ref.routing.trained  # the reference replays r3's routing, records nothing
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
        assert group.worker.actor.routing.tap.aux_loss_coef == TinyMoESpec().router_aux_loss_coef == 0.001
    finally:
        group.shutdown()


def _moe_group(model_path: str, extra: list[str]):
    cfg, plan = engine_config(model_path, extra=extra)
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    group.init_model(model_path, with_ref=False)
    return group


def _perturb_routers(engine) -> None:
    """Move the trainer's routers (not the rollout's, whose samples are taken) far enough to route differently."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for router in find_routers(engine.model):
            router.weight.add_(torch.randn(router.weight.shape, generator=gen) * 0.3)


def _fed(attention_mask: torch.Tensor) -> torch.Tensor:
    """Every real token but each row's last, which no rollout forward fed."""
    fed = attention_mask.bool().clone()
    fed[torch.arange(len(fed)), fed.shape[1] - 1 - fed.flip(1).long().argmax(1)] = False
    return fed


def test_r3_replays_the_rollouts_routing_in_every_training_forward(tiny_moe_path, tmp_path):
    """Single-turn rollouts, and the tool loop's multi-turn trajectories (an environment replying to every turn):
    each token replays the experts of the rollout forward that first fed it, observation tokens included."""
    from transformers import AutoTokenizer

    from rlplat.rollout.agent_loop import ToolLoop
    from rlplat.rollout.base import SamplingParams

    (tmp_path / "echo.py").write_text(ECHO_ENVIRONMENT)
    group = _moe_group(tiny_moe_path, ["actor.moe.router_replay=r3", "rollout.agent.name=tool",
                                       f"rollout.agent.environment={tmp_path}/echo.py:Echo"])
    try:
        engine = group.worker.actor
        torch.manual_seed(0)
        single = with_training_fields(group.generate_sequences(prompt_batch(tiny_moe_path)))
        tokenizer = AutoTokenizer.from_pretrained(tiny_moe_path)
        loop = ToolLoop(group.worker.cfg.rollout.agent, tokenizer, response_length=48)
        params = SamplingParams(max_new_tokens=8, stop_token_ids=tuple(range(20, 40)))  # turns that end
        multi = with_training_fields(loop.run(group.worker.rollout, agent_prompts(tokenizer, ["1+2=", "33+4="] * 4),
                                              params))
        observed = torch.zeros_like(multi.tensors["attention_mask"], dtype=torch.bool)  # attended to, not sampled
        observed[:, -48:] = multi.tensors["attention_mask"][:, -48:].bool() & ~multi.tensors["response_mask"].bool()
        assert int(observed.any(-1).sum()) >= 4  # trajectories of several turns
        for batch, observations in ((single, None), (multi, observed)):
            routed, t = batch.tensors["routed_experts"], batch.tensors
            assert routed.shape == (*t["input_ids"].shape, 2, 2) and routed.dtype == torch.int16
            fed = _fed(t["attention_mask"])
            assert bool((routed[fed] >= 0).all()) and bool((routed[~t["attention_mask"].bool()] == -1).all())
            if observations is not None:
                assert bool((routed[observations & fed] >= 0).all())
        _check_replay(engine, single, multi)
    finally:
        group.shutdown()


def _check_replay(engine, *batches) -> None:
    """The trainer's routers route as the rollout's; once moved (the trainer's side only), 10-98% of the choices
    differ without replay, none with r3, and the trainer's log-probs of the sampled tokens come closer."""

    def trained(batch, replay: str):
        engine.routing.replay = replay
        out = engine.forward(batch, grad=True)
        mask = batch.tensors["response_mask"].bool()
        metrics = out.router_metrics
        used, own = metrics["moe/routing_mismatch_frac"], metrics["moe/router_mismatch_frac"]
        return used, own, (out.log_probs - batch.tensors["rollout_log_probs"])[mask]

    for batch in batches:
        used, own, gap = trained(batch, "none")
        assert used == own == 0 and gap.abs().max() < 1e-4  # the trainer's routers are the rollout's
    _perturb_routers(engine)  # the trainer's side only: the rollout's samples are taken
    for batch in batches:
        mismatch_none, own_none, gap_none = trained(batch, "none")
        mismatch_r3, own_r3, gap_r3 = trained(batch, "r3")
        print(f"routing mismatch none {mismatch_none:.3f} r3 {mismatch_r3:.3f} (the routers' own choice: "
              f"{own_r3:.3f}); mean |log-prob gap| none {gap_none.abs().mean():.4f} r3 {gap_r3.abs().mean():.4f}")
        assert mismatch_none > 0.1 and mismatch_r3 == 0
        assert own_none == mismatch_none and own_r3 == pytest.approx(mismatch_none, abs=0.02)  # what r3 corrected
        assert gap_r3.abs().mean() < 0.75 * gap_none.abs().mean()  # single-turn 0.024 vs 0.039: the gates moved too
    batch = batches[0]  # the log-prob pass replays it too
    mask = batch.tensors["response_mask"].bool()
    replayed = engine.infer(batch, split=MicroBatching(4))["log_probs"]
    torch.testing.assert_close(replayed[mask], engine.forward(batch).log_probs[mask].detach())
    with pytest.raises(KeyError, match="routed_experts"):
        engine.forward(batch.select([k for k in batch.tensors.keys() if k != "routed_experts"]))


def test_r2_replays_the_log_prob_pass_routing_also_in_the_recomputation(tiny_moe_path):
    grads = []
    for checkpointing in (False, True):
        group = _moe_group(tiny_moe_path, ["actor.moe.router_replay=r2",
                                           f"model.gradient_checkpointing={checkpointing}"])
        try:
            engine = group.worker.actor
            torch.manual_seed(0)
            batch = with_training_fields(group.generate_sequences(prompt_batch(tiny_moe_path)))
            old = group.compute_log_probs(batch)
            assert group.worker.plan.old_policy == "recompute"
            recorded, rollout = old.tensors["old_routed_experts"], batch.tensors["routed_experts"]
            real = batch.tensors["attention_mask"].bool()
            assert bool((recorded[real] >= 0).all()) and bool((recorded[~real] == -1).all())
            fed = rollout >= 0  # the same weights: the rollout routed every token it fed the same way
            assert torch.equal(recorded[fed], rollout[fed])
            batch = batch.union(old)
            _perturb_routers(engine)  # as an update would: the routers now choose differently
            # the rollout's routing compared with is the log-prob pass's, so r2's forward uses it exactly
            out = engine.forward(batch, grad=True)
            assert out.router_metrics["moe/routing_mismatch_frac"] == 0
            (out.log_probs.sum() + out.router_loss).backward()
            grads.append([p.grad.clone() for p in engine.model.parameters() if p.grad is not None])
        finally:
            group.shutdown()
    # the recomputation in the backward pass routed as the forward did: the same gradients
    assert len(grads[0]) == len(grads[1])
    for plain, recomputed in zip(*grads):
        torch.testing.assert_close(recomputed, plain, atol=1e-6, rtol=0)


@pytest.mark.parametrize("extra, message", [
    (["actor.moe.router_replay=r4"], r"actor.moe.router_replay='r4' is not one of: none, r2, r3"),
    (["model.path=embedded", "actor.moe.router_replay=r2"],
     r"actor.moe.router_replay=r2: model.path=embedded is a dense model \(no experts to route\)"),
    (["actor.moe.router_replay=r3", "rollout.hf.use_model_generation_config=true"],
     r"actor.moe.router_replay=r3 replays the rollout engine's routing, which the hf engine does not return"),
    (["actor.moe.router_replay=r3", "rollout.agent.name=client",
      "rollout.agent.harness=examples/environments/harnesses.py:again"],
     r"actor.moe.router_replay=r3: the client agent loop's trajectories do not carry the rollout's routing"),
])
def test_what_mixtures_of_experts_cannot_run_yet_is_one_line_at_start_up(extra, message):
    with pytest.raises(ConfigError, match=message):
        chosen = any(arg.startswith("model.path=") for arg in extra)
        # planned as for a machine that has the engines' packages (vllm need not be installed here)
        load_run_config([*([] if chosen else ["model.path=embedded-moe"]), *extra], require_installed=False)


@pytest.mark.parametrize("replay, fields", [("none", "routed_experts"),
                                            ("r2", "routed_experts and old_routed_experts")])
def test_the_plan_counts_the_routing_the_batch_carries(replay, fields, small_val, capsys):
    """The HF rollout returns a mixture of experts' routing whatever the mode; r2 adds the log-prob pass's: int16 per
    (token, sparse layer, choice) of the step's batch (a dense model's plan has no such line)."""
    import re

    from rlplat.planner.memory import fmt
    from rlplat.tools import plan as plan_tool

    data = [f"data.train_files={small_val}", f"data.val_files={small_val}"]  # prompt lengths read fast
    assert plan_tool.main(["model.path=embedded-moe", f"actor.moe.router_replay={replay}", *data]) == 0
    out = capsys.readouterr().out
    tokens = int(re.search(r"tokens: at most ([\d,]+) ", out).group(1).replace(",", ""))
    size = tokens * 2 * 2 * 2 * len(fields.split(" and "))  # 2 sparse layers, top-2, int16
    assert (f"routing: {fields} [sequences, tokens, 2 layers, top-2] int16, at most {fmt(size)} per step, "
            f"{fmt(size)} per replica") in out
    assert plan_tool.main(data) == 0 and "routing:" not in capsys.readouterr().out


def test_the_embedded_moe_is_built_at_its_warm_starts_threads_whatever_the_callers(monkeypatch, tmp_path):
    """Each thread count builds another embedded MoE (docs/moe.md#the-embedded-moe): the build computes with the
    threads its warm start names, then gives the caller its own back."""
    from rlplat.models.embedded import MOE_WARM_START
    from rlplat.trainer import sft

    seen = []
    monkeypatch.setattr(sft, "_warm_start", lambda *args: seen.append(torch.get_num_threads()) or tmp_path)
    threads = torch.get_num_threads()
    try:
        for caller in (1, 3):
            torch.set_num_threads(caller)
            sft._build_embedded_model("embedded-moe", tmp_path, None, tmp_path)
            assert torch.get_num_threads() == caller
    finally:
        torch.set_num_threads(threads)
    assert seen == [MOE_WARM_START["threads"]] * 2 == [2, 2]
