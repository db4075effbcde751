"""The engine checks on CUDA: nccl, world size 1, in-process (the GPU machine has no Ray).

fp32 (no mixed precision) must match like the CPU tests; bf16 (the GPU default: bf16 rollout model,
FSDP bf16 compute with fp32 master weights) is compared with a tolerance that bf16's 8-bit mantissa
allows, and the measured differences are printed for the record.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlplat.controller import InProcessWorkerGroup
from rlplat.workers.roles import ActorRolloutRefWorker

from workers.helpers import engine_config, full_weights, prompt_batch, reference_log_probs, with_training_fields

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_cuda_rollout_log_probs_update_and_sync(tiny_model_path, precision):
    extra = ["rollout.dtype=float32", "actor.fsdp.mixed_precision=none"] if precision == "float32" else []
    cfg, plan = engine_config(tiny_model_path, extra=extra, device="cuda")
    assert plan.device == "cuda"
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cuda", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=True)
        worker = group.worker
        assert torch.distributed.get_backend() == "nccl"
        assert next(worker.rollout.model.parameters()).dtype == getattr(torch, precision)
        torch.manual_seed(0)
        out = group.generate_sequences(prompt_batch(tiny_model_path, temperature=0.8))
        mask = out.tensors["response_mask"].bool()
        recomputed = group.compute_log_probs(out).tensors["old_log_probs"]
        diff = (recomputed - out.tensors["rollout_log_probs"])[mask].abs()
        plain = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        with torch.no_grad():
            exact = reference_log_probs(plain, out, 0.8)
        vs_fp32 = (recomputed - exact)[mask].abs()
        print(f"\n[{precision}] rollout vs training log-probs: max {diff.max():.2e} mean {diff.mean():.2e}; "
              f"training vs CPU fp32: max {vs_fp32.max():.2e}")
        tolerance = 1e-4 if precision == "float32" else 0.1
        assert diff.max() < tolerance and vs_fp32.max() < tolerance

        before = {k: v.clone() for k, v in worker.rollout.model.state_dict().items()}
        metrics = group.update_actor(with_training_fields(out))[0]
        assert metrics["grad_norm"] > 0
        group.generate_sequences(prompt_batch(tiny_model_path))  # sends the weights, bucketed, in bf16/fp32
        after = worker.rollout.model.state_dict()
        assert any(not torch.equal(before[k], after[k]) for k in before)
        trained = dict(full_weights(worker.actor))
        for name, tensor in after.items():
            torch.testing.assert_close(tensor, trained[name].to(tensor.dtype))
    finally:
        group.shutdown()


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_cuda_megatron_matches_fsdp(tiny_model_path, precision):
    """At TP 1 the Megatron engine's log-probs equal the FSDP engine's on the same responses (within 1e-3 in
    fp32, 2e-2 with bf16 compute), and one update moves both alike."""
    pytest.importorskip("megatron.core", reason="needs megatron-core")
    mixed = "none" if precision == "float32" else "bf16"
    extra = ["rollout.dtype=float32", f"actor.fsdp.mixed_precision={mixed}", f"actor.megatron.mixed_precision={mixed}"]
    rollout, results = None, {}
    for strategy in ("fsdp", "megatron"):
        cfg, plan = engine_config(tiny_model_path, extra=[f"actor.strategy={strategy}", *extra], device="cuda")
        group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cuda", cfg=cfg, plan=plan)
        try:
            group.init_model(tiny_model_path, with_ref=False)
            if rollout is None:
                torch.manual_seed(0)
                rollout = group.generate_sequences(prompt_batch(tiny_model_path, temperature=0.8))
            log_probs = group.compute_log_probs(rollout).tensors["old_log_probs"]
            metrics = group.update_actor(with_training_fields(rollout))[0]
            weights = {name: t.detach().float().cpu() for name, t in full_weights(group.worker.actor)}
            results[strategy] = log_probs, metrics, weights
        finally:
            group.shutdown()
    mask = rollout.tensors["response_mask"].bool()
    (fsdp, fsdp_metrics, fsdp_weights), (megatron, megatron_metrics, megatron_weights) = results.values()
    diff = (megatron - fsdp)[mask].abs()
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).state_dict()
    step = max((fsdp_weights[n] - initial[n]).abs().max() for n in initial)
    apart = max((megatron_weights[n] - fsdp_weights[n]).abs().max() for n in initial)
    # AdamW's first step moves every weight by about lr * sign(gradient), so a weight whose gradient is near 0
    # can move the other way under bf16 rounding: in bf16 the updates are compared as whole vectors
    flat = lambda w: torch.cat([(w[n] - initial[n]).flatten() for n in sorted(initial)])  # noqa: E731
    relative = float((flat(megatron_weights) - flat(fsdp_weights)).norm() / flat(fsdp_weights).norm())
    print(f"\n[megatron vs fsdp, {precision}] log-probs: max {diff.max():.2e} mean {diff.mean():.2e}; grad_norm "
          f"{megatron_metrics['grad_norm']:.6f} vs {fsdp_metrics['grad_norm']:.6f}; weights after the update: "
          f"max apart {apart:.2e} (the update moved them up to {step:.2e}); updates apart {relative:.3f} (relative L2)")
    assert diff.max() <= (1e-3 if precision == "float32" else 2e-2)
    assert megatron_metrics["grad_norm"] == pytest.approx(fsdp_metrics["grad_norm"], rel=1e-3 if mixed == "none" else 5e-2)
    if precision == "float32":
        assert apart < 1e-5
    else:
        assert relative < 0.1  # an H200 gave 0.017 (docs/performance.md, "Engines on a GPU")


def test_cuda_grpo_trains_three_steps_with_megatron(tmp_path):
    """The whole loop in-process on one GPU with actor.strategy=megatron (bf16 compute)."""
    pytest.importorskip("megatron.core", reason="needs megatron-core")
    import json

    from rlplat.trainer.main import main

    out = tmp_path / "run"
    assert main(["algorithm=grpo", "actor.strategy=megatron", "trainer.device=cuda", "trainer.ray_address=inprocess",
                 "trainer.total_steps=3", "trainer.test_freq=-1", "data.train_batch_size_prompts=16",
                 f"trainer.output_dir={out}"]) == 0
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "actor/grad_norm" in s]  # the training steps (validation lines have none)
    # Keys every training step logs: actor/grad_norm and actor/lr from the engine's optimizer step
    # (rlplat/engines/optim.py, prefixed by PPOTrainer.update_actor), score/mean from data_metrics
    # (rlplat/trainer/metrics.py; the arithmetic task scores 0 or 1). Indexed, not .get(): a missing key fails.
    print("\n[megatron grpo, cuda] " + "; ".join(f"step {s['step']}: grad_norm {s['actor/grad_norm']:.4f}, "
                                                 f"score {s['score/mean']:.3f}, lr {s['actor/lr']:.2e}"
                                                 for s in steps))
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(0 < s["actor/grad_norm"] < 100 and 0 <= s["score/mean"] <= 1 and s["actor/lr"] > 0 for s in steps)


def test_cuda_moe_replays_the_rollouts_routing_and_syncs_the_experts(tmp_path):
    """A tiny Qwen3-MoE at the GPU defaults (bf16 rollout model, bf16 mixed-precision training): with r3 every
    training forward uses the rollout's experts (mismatch 0) and its log-probs are at least as close to the
    rollout's as without replay (the precision gap of docs/moe.md, measured and printed); the update moves the
    experts, and the weight sync carries them into the rollout model."""
    from rlplat.models.tiny import TinyMoESpec, build_tiny_model

    device, path = "cuda", str(build_tiny_model(tmp_path / "moe", TinyMoESpec(), seed=0))
    gaps, routed = {}, {}
    for replay in ("none", "r3"):
        cfg, plan = engine_config(path, extra=[f"actor.moe.router_replay={replay}"], device=device)
        group = InProcessWorkerGroup(ActorRolloutRefWorker, device=device, cfg=cfg, plan=plan)
        try:
            group.init_model(path, with_ref=False)
            torch.manual_seed(0)
            out = group.generate_sequences(prompt_batch(path, temperature=1.0))
            mask = out.tensors["response_mask"].bool()
            recomputed = group.compute_log_probs(out).tensors["old_log_probs"]
            gaps[replay] = float((recomputed - out.tensors["rollout_log_probs"])[mask].abs().mean())
            held = group.worker.rollout.model.state_dict()
            before = {k: v.clone() for k, v in held.items() if ".experts." in k}
            metrics = group.update_actor(with_training_fields(out))[0]
            routed[replay] = metrics["moe/routing_mismatch_frac"], metrics["moe/router_mismatch_frac"]
            if replay == "r3":
                group.generate_sequences(prompt_batch(path))  # the weight sync, bucketed
                after, trained = group.worker.rollout.model.state_dict(), dict(full_weights(group.worker.actor))
                assert before and all(not torch.equal(before[k], after[k]) for k in before)
                for name, tensor in after.items():
                    torch.testing.assert_close(tensor, trained[name].to(tensor.dtype))
        finally:
            group.shutdown()
    print(f"\n[moe, {device}] mean |rollout - training log-prob|: none {gaps['none']:.2e}, r3 {gaps['r3']:.2e}; "
          f"experts used / routers' own choice unlike the rollout's: none {routed['none'][0]:.4f} / "
          f"{routed['none'][1]:.4f}, r3 {routed['r3'][0]:.4f} / {routed['r3'][1]:.4f}")
    assert routed["r3"][0] == 0 and routed["none"][0] == routed["none"][1]
    assert gaps["r3"] <= gaps["none"] * 1.01 + 1e-6
