"""LoRA on the FSDP engine (model.lora): only the adapters train, the base model is the reference with no copy,
the rollout engine and the export get the merged weights, checkpoints hold the adapters, and the gated MLP's
lean backward pass computes the adapters' gradients as peft's own layers do."""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlplat.config import ConfigError
from rlplat.controller import InProcessWorkerGroup, RayWorkerGroup, ResourcePool
from rlplat.engines import MicroBatching
from rlplat.engines.gated_mlp import GatedMLP, install_gated_mlp
from rlplat.engines.lora import adapters_disabled, inject_lora, merged
from rlplat.trainer.run import load_run_config
from rlplat.workers.engine_setup import build_training_engine
from rlplat.workers.roles import ActorRolloutRefWorker

from workers.helpers import engine_config, full_weights, prompt_batch, reference_log_probs, with_training_fields

LORA = ["model.lora.rank=4", "model.lora.alpha=8", "algorithm.use_kl_loss=true"]


def _lora_cfg(rank=4, alpha=8.0, dropout=0.0, targets=()):
    cfg, _ = load_run_config(["trainer.ray_address=inprocess", f"model.lora.rank={rank}", f"model.lora.alpha={alpha}",
                              f"model.lora.target_modules=[{','.join(targets)}]"])
    lora = OmegaConf.create(OmegaConf.to_container(cfg.model.lora))
    lora.dropout = dropout  # > 0: what start-up refuses, for the fused MLP's own guard
    return lora


def _qwen2_with_adapters() -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    model = Qwen2ForCausalLM(config).float()
    inject_lora(model, _lora_cfg())
    for name, param in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero: give the adapters something to add
            torch.nn.init.normal_(param, std=0.1)
    return model


def test_the_gated_mlp_computes_the_adapters_gradients_as_peft_does():
    plain = _qwen2_with_adapters()
    lean = copy.deepcopy(plain)
    assert install_gated_mlp(lean) == 2 and isinstance(lean.model.layers[0].mlp, GatedMLP)
    ids = torch.arange(22).reshape(2, 11) % 40
    outputs = []
    for model in (plain, lean):
        logits = model(input_ids=ids).logits
        logits.log_softmax(-1).gather(-1, ids[..., None]).sum().backward()
        outputs.append((logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}))
    (logits, grads), (lean_logits, lean_grads) = outputs
    torch.testing.assert_close(lean_logits, logits, rtol=0, atol=1e-6)
    assert grads.keys() == lean_grads.keys() and any("down_proj.lora_A" in n for n in grads)
    for name in grads:
        torch.testing.assert_close(lean_grads[name], grads[name], rtol=1e-5, atol=1e-7, msg=name)
    # without its adapters the block is the base model's
    base = copy.deepcopy(plain)
    with adapters_disabled(lean), adapters_disabled(base), torch.no_grad():
        torch.testing.assert_close(lean(input_ids=ids).logits, base(input_ids=ids).logits, rtol=0, atol=1e-6)


def test_dropout_on_the_down_projections_adapter_keeps_the_models_own_mlp():
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=96, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2))
    inject_lora(model, _lora_cfg(dropout=0.1))
    assert install_gated_mlp(model) == 0


def test_merging_gives_hugging_face_names_and_w_plus_scaled_b_a():
    w, a, b = torch.randn(6, 5), torch.randn(2, 5), torch.randn(6, 2)
    items = [("x.q.base_layer.weight", w), ("x.q.base_layer.bias", torch.ones(6)), ("x.q.lora_A.default.weight", a),
             ("x.q.lora_B.default.weight", b), ("x.norm.weight", torch.ones(5))]
    out = merged(items, {"x.q": 0.5}, torch.bfloat16)
    assert [name for name, _ in out] == ["x.q.weight", "x.q.bias", "x.norm.weight"]
    assert all(t.dtype == torch.bfloat16 for _, t in out)
    torch.testing.assert_close(out[0][1], (w + 0.5 * b @ a).to(torch.bfloat16))


def test_unknown_target_modules_are_one_config_error(tiny_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with pytest.raises(ConfigError, match=r"model.lora.target_modules=\['qkv_fused'\]: .*qkv_fused"):
        inject_lora(model, _lora_cfg(targets=["qkv_fused"]))


@pytest.mark.parametrize("extra, message", [
    (["model.lora.rank=-1"], r"model.lora.rank must be >= 0 \(0 = off\), got -1"),
    # the model trains in eval mode (no dropout): an adapter dropout would be silently ignored
    (["model.lora.rank=8", "model.lora.dropout=0.05"], r"model.lora.dropout=0.05 would do nothing: rlplat trains "
                                                        r"without dropout"),
    (["model.lora.rank=8", "model.lora.alpha=0"], r"model.lora.alpha must be > 0, got 0"),
    (["model.lora.rank=8", "actor.strategy=megatron"],
     r"model.lora.rank=8: LoRA is not supported on the Megatron engine yet; use actor.strategy=fsdp"),
    (["model.lora.rank=8", "rollout.lora_sync=adapter", "rollout=vllm", "rollout.mode=server",
      "rollout.server.url=http://127.0.0.1:8000"],
     r"rollout.lora_sync=adapter: a rollout server \(rollout.mode=server\) cannot apply LoRA adapters from rlplat"),
])
def test_lora_settings_are_checked(extra, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(["trainer.ray_address=inprocess", *extra])


def test_the_reference_of_a_lora_run_is_the_actors_base_model_and_needs_no_copy(tiny_model_path):
    cfg, plan = engine_config(tiny_model_path, extra=LORA)
    assert plan.reference == "adapters"
    # an explicit reference copy stays possible (on Ray)
    separate = load_run_config([f"model.path={tiny_model_path}", *LORA, "ref.placement=separate"])[1]
    assert separate.reference == "separate"
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=plan.reference == "colocated")
        worker = group.worker
        assert worker.ref is None  # no reference model was built
        prompts = prompt_batch(tiny_model_path)
        for seed in range(2):
            out = group.generate_sequences(prompts)
            metrics = group.update_actor(with_training_fields(out, seed))[0]
            assert metrics["grad_norm"] > 0
        weights = dict(worker.actor.model.named_parameters())
        base = dict(AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).named_parameters())
        # the base weights are bit for bit the model's; only the adapters moved
        frozen = {name.replace(".base_layer", ""): p for name, p in weights.items() if "lora_" not in name}
        assert frozen.keys() == base.keys()
        for name, param in frozen.items():
            assert torch.equal(param, base[name]) and not param.requires_grad, name
        adapters = {name: p for name, p in weights.items() if "lora_" in name}
        assert adapters and all(p.requires_grad for p in adapters.values())
        assert all(p.abs().sum() > 0 for n, p in adapters.items() if "lora_B" in n)  # B started at zero
        assert [id(p) for p in worker.actor.optim.params] == [id(p) for p in adapters.values()]

        # the reference log-probs: the actor's model with its adapters off = a separate frozen copy of the base
        out = group.generate_sequences(prompts)
        out.meta["temperature"] = 1.0
        ref = group.compute_ref_log_probs(out).tensors["ref_log_probs"]
        copy_engine = build_training_engine(cfg, "ref", tiny_model_path, worker.dist)
        expected = copy_engine.infer(out, split=MicroBatching(3), temperature=1.0)["log_probs"]
        assert torch.equal(ref, expected)
        policy = group.compute_log_probs(out).tensors["old_log_probs"]
        mask = out.tensors["response_mask"].bool()
        assert (policy - ref)[mask].abs().max() > 1e-3  # the adapters do change the policy
        # the rollout engine samples with the merged weights: its log-probs are the trainer's
        torch.testing.assert_close(out.tensors["rollout_log_probs"][mask], policy[mask], atol=1e-5, rtol=0)
    finally:
        group.shutdown()


@pytest.mark.slow
def test_lora_on_two_fsdp_workers_is_the_one_worker_update_and_checkpoint(ray_cluster, tiny_model_path, tmp_path):
    # FSDP2 shards base weights (frozen) and adapters (trained) together; the adapters start alike on every
    # rank; the merged weights gathered from two shards are one worker's after the same update, and a
    # checkpoint (adapters only) written by two workers restores one
    cfg2, plan2 = engine_config(tiny_model_path, workers=2, extra=LORA)
    cfg1, plan1 = engine_config(tiny_model_path, extra=LORA)
    pool = ResourcePool(nnodes=1, workers_per_node=2, device="cpu").create()
    sharded = RayWorkerGroup(ActorRolloutRefWorker, pool, cfg=cfg2, plan=plan2)
    single = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg1, plan=plan1)
    try:
        sharded.init_model(tiny_model_path, with_ref=False)
        single.init_model(tiny_model_path, with_ref=False)
        out = single.generate_sequences(prompt_batch(tiny_model_path))
        train = with_training_fields(out)
        sharded.update_actor(train)
        single.update_actor(train)
        merged_sharded, merged_single = sharded.actor_weights()[0], dict(full_weights(single.worker.actor))
        assert merged_sharded.keys() == merged_single.keys()
        for name, tensor in merged_single.items():
            torch.testing.assert_close(merged_sharded[name], tensor, atol=1e-6, rtol=1e-5, msg=name)
        out.meta["temperature"] = 1.0
        mask = out.tensors["response_mask"].bool()
        ref = sharded.compute_ref_log_probs(out).tensors["ref_log_probs"]
        plain = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        with torch.no_grad():
            expected = reference_log_probs(plain, out, 1.0)
        torch.testing.assert_close(ref[mask], expected[mask], atol=1e-5, rtol=0)  # the base model's
        sharded.save_checkpoint(str(tmp_path / "ckpt"))
        single.load_checkpoint(str(tmp_path / "ckpt"))
        restored = dict(full_weights(single.worker.actor))
        for name, tensor in merged_sharded.items():
            torch.testing.assert_close(restored[name], tensor, atol=1e-6, rtol=1e-5, msg=name)
    finally:
        sharded.shutdown()
        single.shutdown()
        pool.release()


@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_the_rollout_engine_samples_the_trained_policy_with_either_sync(tiny_model_path, sync):
    # merged: the merged weights go in (the whole model's bytes); adapter: the adapters alone (a few KiB),
    # which the HF engine applies with peft's layers over its own base weights
    cfg, plan = engine_config(tiny_model_path, extra=[*LORA, f"rollout.lora_sync={sync}"])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=False)
        worker = group.worker
        prompts = prompt_batch(tiny_model_path)
        group.update_actor(with_training_fields(group.generate_sequences(prompts)))
        out = group.generate_sequences(prompts)  # sends the update first
        adapters = sum(p.numel() * 4 for n, p in worker.actor.model.named_parameters() if "lora_" in n)
        whole = sum(t.numel() * 4 for _, t in full_weights(worker.actor))
        assert out.meta["weight_sync_mb"] * 2**20 == (adapters if sync == "adapter" else whole)
        policy = group.compute_log_probs(out).tensors["old_log_probs"]
        mask = out.tensors["response_mask"].bool()
        torch.testing.assert_close(out.tensors["rollout_log_probs"][mask], policy[mask], atol=1e-5, rtol=0)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        with torch.no_grad():
            assert (reference_log_probs(base, out, 1.0) - policy)[mask].abs().max() > 1e-3  # not the base model
    finally:
        group.shutdown()



@pytest.mark.parametrize("targets", [(), ("q_proj", "v_proj", "down_proj")])
def test_the_plans_adapter_count_is_peft_s(tiny_model_path, targets):
    from transformers import AutoConfig

    from rlplat.models.shape import ModelShape, lora_params

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    lora = _lora_cfg(rank=4, targets=targets)
    inject_lora(model, lora)
    adapters = sum(p.numel() for name, p in model.named_parameters() if "lora_" in name)
    assert lora_params(ModelShape.from_config(AutoConfig.from_pretrained(tiny_model_path)), lora) == adapters


@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_a_rollout_worker_of_its_own_receives_and_checks_a_lora_update(tiny_model_path, sync):
    # rollout.mode=separate (here in one process, without Ray): the numbered update carries the merged weights
    # or the adapters alone; the rollout worker's checks pass (checksums of what the engine holds, the probe
    # at 1e-5), and a damaged adapter is named
    from rlplat.workers.roles import RolloutWorker

    cfg, plan = engine_config(tiny_model_path, extra=[*LORA, f"rollout.lora_sync={sync}"])
    actor = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    rollout = InProcessWorkerGroup(RolloutWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        actor.init_model(tiny_model_path, with_ref=False, with_rollout=False)
        rollout.init_model(tiny_model_path)
        prompts = prompt_batch(tiny_model_path)
        actor.update_actor(with_training_fields(rollout.generate_sequences(prompts)))
        update = actor.weight_update(1, True, list(range(5, 25)), 1e-5)[0]
        names = [name for bucket in update.buckets for name, _ in bucket]
        assert all(".lora_" in name for name in names) == (sync == "adapter")
        assert rollout.receive_weights(update) == [None]
        out = rollout.generate_sequences(prompts)
        mask = out.tensors["response_mask"].bool()
        policy = actor.compute_log_probs(out).tensors["old_log_probs"]
        torch.testing.assert_close(out.tensors["rollout_log_probs"][mask], policy[mask], atol=1e-5, rtol=0)
        dict(pair for bucket in update.buckets for pair in bucket)[names[1]].view(-1)[0] += 1  # damaged on its way
        assert f"holds {names[1]!r} with other bits than the actor sent" in rollout.receive_weights(update)[0]
    finally:
        rollout.shutdown()
        actor.shutdown()


def test_a_synced_lora_reference_keeps_its_own_adapters_and_checkpoints_them(tiny_model_path, tmp_path):
    # ref.sync_steps with LoRA: the reference is the base model with a copy of the adapters (B starts at zero:
    # the base model exactly), blended towards the actor's at each sync; the base weights stay shared
    cfg, plan = engine_config(tiny_model_path, extra=[*LORA, "ref.sync_steps=2", "ref.sync_alpha=0.5"])
    assert plan.reference == "adapters"
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=False)
        engine = group.worker.actor
        prompts = prompt_batch(tiny_model_path)
        out = group.generate_sequences(prompts)
        out.meta["temperature"] = 1.0
        group.update_actor(with_training_fields(out))
        base = build_training_engine(cfg, "ref", tiny_model_path, group.worker.dist)
        base_lp = base.infer(out, split=MicroBatching(3), temperature=1.0)["log_probs"]
        assert torch.equal(group.compute_ref_log_probs(out).tensors["ref_log_probs"], base_lp)  # not synced yet

        before = {name: t.clone() for name, t in engine.lora.reference_adapters.items()}
        actor = {name: p.detach().clone() for name, p in engine.lora.adapters().items()}
        group.sync_reference(0.5)
        for name, ref in engine.lora.reference_adapters.items():
            torch.testing.assert_close(ref, 0.5 * actor[name] + 0.5 * before[name], rtol=0, atol=1e-7)
        group.save_checkpoint(str(tmp_path / "ckpt"))
        synced = group.compute_ref_log_probs(out).tensors["ref_log_probs"]
        assert not torch.equal(synced, base_lp)
        for name, p in engine.lora.adapters().items():  # the actor's own adapters are back after the reference pass
            assert torch.equal(p.detach(), actor[name])

        group.sync_reference(1.0)  # alpha 1: the reference becomes the actor
        policy = group.compute_log_probs(out).tensors["old_log_probs"]
        assert torch.equal(group.compute_ref_log_probs(out).tensors["ref_log_probs"], policy)
        group.load_checkpoint(str(tmp_path / "ckpt"))  # the checkpoint's reference adapters come back
        assert torch.equal(group.compute_ref_log_probs(out).tensors["ref_log_probs"], synced)
    finally:
        group.shutdown()
