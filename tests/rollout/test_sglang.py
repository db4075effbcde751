"""SGLang as the colocated rollout engine. SGLang has CUDA kernels only: these tests run on a GPU machine
where ``sglang`` imports, and skip everywhere else."""

import pytest
import torch

from rlplat.controller import InProcessWorkerGroup
from rlplat.workers.roles import ActorRolloutRefWorker
from workers.helpers import engine_config, prompt_batch, with_training_fields

pytest.importorskip("sglang")
pytestmark = pytest.mark.gpu


def test_sglang_samples_with_the_trainers_log_probs_before_and_after_an_update(tiny_model_path):
    cfg, plan = engine_config(tiny_model_path, device="cuda", extra=[
        "rollout=sglang", "rollout.dtype=float32", "actor.fsdp.mixed_precision=none", "actor.optim.lr=1e-2",
        "rollout.sglang.mem_fraction_static=0.3"])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cuda", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=False)
        prompts = prompt_batch(tiny_model_path, temperature=1.0)
        for round_ in range(2):
            out = group.generate_sequences(prompts.repeat(2, interleave=True))
            assert len(out) == 2 * len(prompts)
            mask = out.tensors["response_mask"].bool()
            trainer = group.compute_log_probs(out).tensors["old_log_probs"]
            torch.testing.assert_close(out.tensors["rollout_log_probs"][mask], trainer[mask], atol=1e-3, rtol=0)
            group.update_actor(with_training_fields(out))  # the second round samples from these weights
    finally:
        group.shutdown()
