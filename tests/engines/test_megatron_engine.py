"""The Megatron-Core training engine on CPU (gloo): log-probs, entropy and one optimizer step equal an
unsharded Hugging Face model's, at TP = 1 in-process, TP = 2 and DP = 2 on two Ray workers; the rollout
receives its weights in Hugging Face names; bad parallel sizes are one config line."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlplat.config import ConfigError
from rlplat.controller import InProcessWorkerGroup, RayWorkerGroup, ResourcePool
from rlplat.trainer.run import load_run_config
from rlplat.workers.roles import ActorRolloutRefWorker
from workers.helpers import engine_config, prompt_batch, reference_log_probs, single_process_step, with_training_fields

pytest.importorskip("megatron.core", reason="needs megatron-core (pip install -e '.[megatron]')")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def megatron(tp: int) -> list[str]:
    return ["actor.strategy=megatron", f"actor.megatron.tensor_model_parallel_size={tp}"]


def check_matches_unsharded(group, cfg, plan, model_path: str, ranks: int) -> None:
    torch.manual_seed(0)
    out = group.generate_sequences(prompt_batch(model_path, temperature=0.7))
    plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    mask = out.tensors["response_mask"].bool()
    with torch.no_grad():
        expected = reference_log_probs(plain, out, 0.7)
        logits = plain(input_ids=out.tensors["input_ids"], attention_mask=out.tensors["attention_mask"],
                       position_ids=out.tensors["position_ids"]).logits[:, -mask.shape[1] - 1: -1] / 0.7
    got = group.compute_log_probs(out)
    torch.testing.assert_close(got.tensors["old_log_probs"][mask], expected[mask], atol=1e-5, rtol=0)
    entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(got.tensors["entropy"][mask], entropy[mask], atol=1e-5, rtol=0)

    train = with_training_fields(out)
    group.update_actor(train)
    weights = group.actor_weights()
    assert len(weights) == ranks
    reference = single_process_step(model_path, cfg, train, plan.loss_scale_factor)
    for rank_weights in weights:
        assert rank_weights.keys() == reference.keys()
        for name, tensor in reference.items():
            torch.testing.assert_close(rank_weights[name], tensor, atol=1e-5, rtol=1e-5)
    synced = group.generate_sequences(prompt_batch(model_path))  # the rollout receives the trained weights
    assert synced.meta["weight_sync_s"] > 0


def test_tp1_in_process_matches_unsharded(tiny_model_path):
    cfg, plan = engine_config(tiny_model_path, extra=megatron(1))
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=True)
        assert type(group.worker.actor).__name__ == "MegatronEngine" == type(group.worker.ref).__name__
        check_matches_unsharded(group, cfg, plan, tiny_model_path, ranks=1)
        # ref.sync_steps: the reference blends in the trained actor (Polyak 0.5, then an exact copy)
        initial = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).state_dict()
        trained = group.actor_weights()[0]
        group.sync_reference(0.5)
        mixed = dict(group.worker.ref.full_weights())
        for name, tensor in trained.items():
            torch.testing.assert_close(mixed[name], 0.5 * initial[name] + 0.5 * tensor, atol=1e-6, rtol=0)
        group.sync_reference(1.0)
        assert all(torch.equal(t, trained[name]) for name, t in group.worker.ref.full_weights())
    finally:
        group.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("tp", [2, 1], ids=["tp2", "dp2"])
def test_two_ray_workers_match_unsharded(ray_cluster, tiny_model_path, tp):
    """tp2: one replica split over both workers (vocabulary padded 103 -> 104); dp2: two replicas. Rows
    are shuffled before the update: the tensor-parallel ranks of a replica must shuffle alike."""
    cfg, plan = engine_config(tiny_model_path, workers=2, extra=[*megatron(tp), "actor.shuffle=true"])
    pool = ResourcePool(nnodes=1, workers_per_node=2, device="cpu").create()
    group = RayWorkerGroup(ActorRolloutRefWorker, pool, cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=False)
        assert [lay.dp_size for lay in group.layouts()] == [2 // tp] * 2
        check_matches_unsharded(group, cfg, plan, tiny_model_path, ranks=2)
    finally:
        group.shutdown()
        pool.release()


@pytest.mark.parametrize("extra, message", [
    (["trainer.workers_per_node=2", "actor.megatron.tensor_model_parallel_size=4"],
     "actor.megatron: tensor x pipeline parallel sizes 4 x 1 must divide the 2 workers"),
    (["trainer.workers_per_node=4", "actor.megatron.tensor_model_parallel_size=4"],
     "actor.megatron: tensor parallel size 4 must divide the 4 attention heads and the 2 key/value heads"),
    (["actor.megatron.pipeline_model_parallel_size=2"],
     "actor.megatron.pipeline_model_parallel_size=2: pipeline parallelism is not supported yet"),
    (["algorithm=ppo", "critic.strategy=megatron"], "critic.strategy=megatron is not supported yet"),
    (["trainer.device=cpu", "actor.megatron.recompute_activations=true"],
     "actor.megatron.recompute_activations needs a GPU"),
])
def test_parallel_sizes_are_one_config_line(extra, message):
    with pytest.raises(ConfigError) as err:
        load_run_config(["actor.strategy=megatron", *extra])
    assert str(err.value).startswith(message), str(err.value)


@pytest.mark.slow
def test_grpo_trains_three_steps_with_tensor_parallel_megatron(ray_cluster, tmp_path):
    """The whole loop on the embedded model, TP = 2 over two Ray workers: the reference equals the actor
    before the first update (KL 0), later steps move it, and the checkpoint and export are written."""
    import json

    from transformers import AutoModelForCausalLM

    from rlplat.trainer.main import main

    out = tmp_path / "run"
    assert main(["algorithm=grpo", "actor.strategy=megatron", "actor.megatron.tensor_model_parallel_size=2",
                 "trainer.workers_per_node=2", "trainer.total_steps=3", "trainer.test_freq=-1",
                 "data.train_batch_size_prompts=16", f"trainer.output_dir={out}"]) == 0
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "actor/kl_loss" in s]
    assert len(steps) == 3 and steps[0]["actor/kl_loss"] == 0 and steps[-1]["actor/kl_loss"] > 0
    assert all(0 < s["actor/grad_norm"] < 100 for s in steps)
    assert (out / "checkpoints" / "step_000003" / "manifest.json").exists()
    AutoModelForCausalLM.from_pretrained(out / "hf_export")  # the export loads as a Hugging Face model
