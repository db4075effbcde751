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

from workers.helpers import engine_config, prompt_batch, reference_log_probs, with_training_fields

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
        trained = dict(worker.actor.full_weights())
        for name, tensor in after.items():
            torch.testing.assert_close(tensor, trained[name].to(tensor.dtype))
    finally:
        group.shutdown()
