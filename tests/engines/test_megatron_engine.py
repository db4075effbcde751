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
from workers.helpers import engine_config, full_weights, prompt_batch, reference_log_probs, single_process_step, with_training_fields

pytest.importorskip("megatron.core", reason="needs megatron-core (pip install -e '.[megatron]')")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def megatron(tp: int, pp: int = 1, recompute: bool = False, sp: bool = False) -> list[str]:
    return ["actor.strategy=megatron", f"actor.megatron.tensor_model_parallel_size={tp}",
            f"actor.megatron.pipeline_model_parallel_size={pp}", f"actor.megatron.recompute_activations={recompute}",
            f"actor.megatron.sequence_parallel={sp}"]


def check_matches_unsharded(group, cfg, plan, model_path: str, ranks: int) -> None:
    torch.manual_seed(0)
    out = group.generate_sequences(prompt_batch(model_path, temperature=0.7))
    plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    mask = out.tensors["response_mask"].bool()
    with torch.no_grad():
        expected = reference_log_probs(plain, out, 0.7)
        logits = plain(input_ids=out.tensors["input_ids"], attention_mask=out.tensors["attention_mask"],
                       position_ids=out.tensors["position_ids"]).logits[:, -mask.shape[1] - 1: -1] / 0.7
    got = group.compute_log_probs(out, entropy=True)
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
    plain.load_state_dict(reference)  # the trained model scores as the trained reference (with pipeline
    with torch.no_grad():  # stages: the last stage's copy of the tied embedding took the same step)
        expected = reference_log_probs(plain, out, 0.7)
    torch.testing.assert_close(group.compute_log_probs(out).tensors["old_log_probs"][mask], expected[mask],
                               atol=1e-5, rtol=0)
    synced = group.generate_sequences(prompt_batch(model_path))  # the rollout receives the trained weights
    assert synced.meta["weight_sync_s"] > 0


@pytest.mark.parametrize("recompute", [False, True], ids=["stored", "recomputed"])
def test_tp1_in_process_matches_unsharded(tiny_model_path, recompute):
    """Also with every layer's activations recomputed in backward (the same gradients)."""
    cfg, plan = engine_config(tiny_model_path, extra=megatron(1, recompute=recompute))
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=True)
        assert type(group.worker.actor).__name__ == "MegatronEngine" == type(group.worker.ref).__name__
        grad_enabled = []  # per forward call of the first layer
        group.worker.actor.model.decoder.layers[0].register_forward_hook(
            lambda *_: grad_enabled.append(torch.is_grad_enabled()))
        check_matches_unsharded(group, cfg, plan, tiny_model_path, ranks=1)
        # 8 rows: 3 log-prob forwards (3 rows each), 4 training forwards (2 rows each; recomputed, each
        # stores nothing, run without autograd, and runs again with it inside backward), 3 log-prob forwards
        training = [False, True] * 4 if recompute else [True] * 4
        assert grad_enabled == [False] * 3 + training + [False] * 3, grad_enabled
        # ref.sync_steps: the reference blends in the trained actor (Polyak 0.5, then an exact copy)
        initial = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).state_dict()
        trained = group.actor_weights()[0]
        group.sync_reference(0.5)
        mixed = dict(full_weights(group.worker.ref))
        for name, tensor in trained.items():
            torch.testing.assert_close(mixed[name], 0.5 * initial[name] + 0.5 * tensor, atol=1e-6, rtol=0)
        group.sync_reference(1.0)
        assert all(torch.equal(t, trained[name]) for name, t in full_weights(group.worker.ref))
        # streamed: one unit per bucket, each Megatron tensor blended once its Hugging Face weights are in
        group.worker.ref.blend_weights([[(n, initial[n])] for n in initial], 1.0)
        assert all(torch.equal(t, initial[name]) for name, t in full_weights(group.worker.ref))
    finally:
        group.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("tp, pp, sp", [(2, 1, False), (1, 1, False), (1, 2, False), (2, 1, True)],
                         ids=["tp2", "dp2", "pp2", "tp2-sp"])
def test_two_ray_workers_match_unsharded(ray_cluster, tiny_model_path, tp, pp, sp):
    """tp2: one replica split over both workers (vocabulary padded 103 -> 104); dp2: two replicas; pp2:
    one layer per worker, run by Megatron-Core's 1F1B schedule over uneven token-budget micro-batches,
    the tied embedding's copy on the last stage kept equal; tp2-sp: with sequence parallelism (the 17
    positions run as 18, a multiple of tp). Rows are shuffled before the update: the tensor-parallel ranks
    of a replica must shuffle alike."""
    budget = ["actor.micro_batch_max_tokens_per_worker=40"] if pp > 1 or sp else []
    cfg, plan = engine_config(tiny_model_path, workers=2, extra=[*megatron(tp, pp, sp=sp), "actor.shuffle=true", *budget])
    pool = ResourcePool(nnodes=1, workers_per_node=2, device="cpu").create()
    group = RayWorkerGroup(ActorRolloutRefWorker, pool, cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=False)
        assert [lay.dp_size for lay in group.layouts()] == [2 // (tp * pp)] * 2
        check_matches_unsharded(group, cfg, plan, tiny_model_path, ranks=2)
    finally:
        group.shutdown()
        pool.release()


@pytest.mark.parametrize("extra, message", [
    (["trainer.workers_per_node=2", "actor.megatron.tensor_model_parallel_size=4"],
     "actor.megatron: tensor x pipeline parallel sizes 4 x 1 must divide the 2 workers"),
    (["trainer.workers_per_node=4", "actor.megatron.tensor_model_parallel_size=4"],
     "actor.megatron: tensor parallel size 4 must divide the 4 attention heads and the 2 key/value heads"),
    (["trainer.workers_per_node=4", "actor.megatron.pipeline_model_parallel_size=4"],
     "actor.megatron: pipeline parallel size 4 must divide the 2 layers"),
    (["trainer.workers_per_node=4", "actor.megatron.tensor_model_parallel_size=2",
      "actor.megatron.pipeline_model_parallel_size=4"],
     "actor.megatron: tensor x pipeline parallel sizes 2 x 4 must divide the 4 workers"),
    (["algorithm=ppo", "critic.strategy=megatron", "trainer.workers_per_node=2",
      "critic.megatron.tensor_model_parallel_size=4"],
     "critic.megatron: tensor x pipeline parallel sizes 4 x 1 must divide the 2 workers"),
    (["actor.megatron.sequence_parallel=true"],
     "actor.megatron.sequence_parallel=true needs actor.megatron.tensor_model_parallel_size > 1"),
    (["actor.megatron.mixed_precision=fp8"], "actor.megatron.mixed_precision='fp8' is not one of: auto, none, bf16"),
    (["trainer.device=cpu", "actor.megatron.mixed_precision=bf16"],
     "actor.megatron.mixed_precision=bf16 needs a GPU (trainer.device resolved to cpu)"),
])
def test_parallel_sizes_are_one_config_line(extra, message):
    with pytest.raises(ConfigError) as err:
        load_run_config(["actor.strategy=megatron", *extra])
    assert str(err.value).startswith(message), str(err.value)


@pytest.mark.slow
def test_grpo_trains_three_steps_with_pipeline_parallel_megatron(ray_cluster, tmp_path):
    """The whole loop on the embedded model, one layer per Ray worker (PP = 2; tensor parallelism runs end to
    end in tests/tools/test_export.py): the reference equals the actor before the first update (KL 0),
    later steps move it, and the checkpoint exports offline to exactly the run's own export."""
    import json

    from rlplat.tools.export import export
    from rlplat.trainer.main import main

    out = tmp_path / "run"
    assert main(["algorithm=grpo", "actor.strategy=megatron", "actor.megatron.pipeline_model_parallel_size=2",
                 "trainer.workers_per_node=2", "trainer.total_steps=3", "trainer.test_freq=-1",
                 "data.train_batch_size_prompts=16", f"trainer.output_dir={out}"]) == 0
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "actor/kl_loss" in s]
    assert len(steps) == 3 and steps[0]["actor/kl_loss"] == 0 and steps[-1]["actor/kl_loss"] > 0
    assert all(0 < s["actor/grad_norm"] < 100 for s in steps)
    export(out / "checkpoints" / "step_000003", tmp_path / "offline")
    run_export = AutoModelForCausalLM.from_pretrained(out / "hf_export").state_dict()
    offline = AutoModelForCausalLM.from_pretrained(tmp_path / "offline").state_dict()
    assert run_export.keys() == offline.keys()
    assert all(torch.equal(offline[name], tensor) for name, tensor in run_export.items())


def critic_run(model_path: str, group_of, strategy: str, workers: int = 1, extra=()):
    """A PPO critic's values for fixed responses, one update towards constant returns, and its values after."""
    from rlplat.protocol import Batch
    from rlplat.rollout.base import assemble_rollout
    from rlplat.workers.roles import CriticWorker

    prompts = prompt_batch(model_path)
    responses = torch.randint(10, 20, (len(prompts), 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(len(prompts), 8, dtype=torch.long)
    mask[0, 5:] = 0
    batch = assemble_rollout(prompts, responses, mask, torch.zeros(len(prompts), 8))
    cfg, plan = engine_config(model_path, workers=workers, extra=["algorithm=ppo", "critic.optim.lr=3e-3",
                                                                  f"critic.strategy={strategy}", *extra])
    group = group_of(CriticWorker, cfg, plan)
    try:
        group.init_model(model_path)
        values = group.compute_values(batch).tensors["values"]
        train = batch.union(Batch.from_dict({"values": values, "returns": torch.ones(8, 8) * mask}))
        metrics = group.update_critic(train)[0]
        return values, metrics, group.compute_values(batch).tensors["values"]
    finally:
        group.shutdown()


def in_process(worker_cls, cfg, plan):
    return InProcessWorkerGroup(worker_cls, device="cpu", cfg=cfg, plan=plan)


def check_same_critic(got, expected) -> None:
    (before, metrics, after), (m_before, m_metrics, m_after) = expected, got
    torch.testing.assert_close(m_before, before, atol=1e-5, rtol=0)
    assert m_metrics["critic/vf_loss"] == pytest.approx(metrics["critic/vf_loss"], abs=1e-6)
    assert m_metrics["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-4)
    assert (after - before).abs().max() > 1e-2  # the update moved the values ...
    torch.testing.assert_close(m_after, after, atol=1e-5, rtol=0)  # ... alike


def test_megatron_critic_matches_the_fsdp_critic(tiny_model_path):
    """critic.strategy=megatron: the backbone with a one-output head (the Hugging Face value model's, as
    the FSDP critic loads it) gives the FSDP critic's values, and one update moves both alike."""
    check_same_critic(critic_run(tiny_model_path, in_process, "megatron"),
                      critic_run(tiny_model_path, in_process, "fsdp"))


@pytest.mark.slow
@pytest.mark.parametrize("tp, pp, sp", [(2, 1, False), (1, 2, False), (2, 1, True)], ids=["tp2", "pp2", "tp2-sp"])
def test_two_ray_workers_megatron_critic_matches_fsdp(ray_cluster, tiny_model_path, tp, pp, sp):
    """The head is replicated over tensor-parallel ranks (its gradient counted once in the norm; with
    sequence parallelism it sees the gathered sequence) and sits on the last pipeline stage."""
    pool = ResourcePool(nnodes=1, workers_per_node=2, device="cpu").create()
    try:
        got = critic_run(tiny_model_path, lambda cls, cfg, plan: RayWorkerGroup(cls, pool, cfg=cfg, plan=plan),
                         "megatron", workers=2, extra=[f"critic.megatron.tensor_model_parallel_size={tp}",
                                                       f"critic.megatron.pipeline_model_parallel_size={pp}",
                                                       f"critic.megatron.sequence_parallel={sp}"])
    finally:
        pool.release()
    check_same_critic(got, critic_run(tiny_model_path, in_process, "fsdp"))


def resumed_step(tmp_path, model_path: str, save_as, load_as) -> tuple[dict, dict]:
    """Update, checkpoint and update again in layout ``save_as``; load the checkpoint in layout ``load_as``
    and take the second update there. Each layout is (workers, megatron overrides). Returns both layouts'
    weights after the second update."""
    weights = []
    for index, (workers, extra) in enumerate((save_as, load_as)):
        cfg, plan = engine_config(model_path, workers=workers, extra=["actor.strategy=megatron", *extra])
        if workers == 1:
            group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
        else:
            pool = ResourcePool(nnodes=1, workers_per_node=workers, device="cpu").create()
            group = RayWorkerGroup(ActorRolloutRefWorker, pool, cfg=cfg, plan=plan)
        try:
            group.init_model(model_path, with_ref=False)
            if index == 0:
                torch.manual_seed(0)
                rollout = group.generate_sequences(prompt_batch(model_path))
                first, second = with_training_fields(rollout), with_training_fields(rollout, seed=1)
                group.update_actor(first)
                group.save_checkpoint(str(tmp_path / "ckpt"))
            else:
                group.load_checkpoint(str(tmp_path / "ckpt"))
            group.update_actor(second)
            weights.append(group.actor_weights()[0])
        finally:
            group.shutdown()
            if workers > 1:
                pool.release()
    return weights[0], weights[1]


@pytest.mark.slow
@pytest.mark.parametrize("save_as, load_as", [
    ((2, ["actor.megatron.use_distributed_optimizer=true"]), (1, [])),
    ((2, ["actor.megatron.tensor_model_parallel_size=2"]), (2, ["actor.megatron.pipeline_model_parallel_size=2"])),
], ids=["dp2-sharded-optimizer-to-one-worker", "tp2-to-pp2"])
def test_a_checkpoint_resumes_in_another_parallel_layout(ray_cluster, tiny_model_path, tmp_path, save_as, load_as):
    """The checkpoint holds weights and AdamW's moments as slices of whole Hugging Face tensors: read back
    into another layout, the next update is the one the writing layout takes (the moments of a sharded
    optimizer included)."""
    continued, resumed = resumed_step(tmp_path, tiny_model_path, save_as, load_as)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).state_dict()
    assert any((continued[name] - initial[name]).abs().max() > 1e-4 for name in initial)
    for name, tensor in continued.items():
        torch.testing.assert_close(resumed[name], tensor, atol=1e-6, rtol=1e-5)


def cuda_only_calls() -> dict[str, object]:
    """The functions that rlplat.engines.megatron.cpu redirects while Megatron-Core runs on CPU."""
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.tensor_parallel import random
    from megatron.core.transformer.moe import moe_utils

    return {"current_device": torch.cuda.current_device, "synchronize": torch.cuda.synchronize,
            "Tensor.cuda": torch.Tensor.cuda, "schedules.torch": schedules.torch,
            "get_rng": random._get_cuda_rng_state, "set_rng": random._set_cuda_rng_state,
            "te_general_gemm": getattr(moe_utils, "te_general_gemm", "undefined")}


def assert_originals(originals: dict[str, object]) -> None:
    now = cuda_only_calls()
    assert [name for name in originals if now[name] is not originals[name]] == []


def test_cpu_redirections_last_only_while_megatron_runs(tiny_model_path):
    """After the engine is built, scores, trains (forward, backward and the optimizer step in Megatron-Core's
    schedule, every layer recomputed) and checkpoints, torch and megatron-core hold their own functions
    again; inside those calls the redirections were in place."""
    originals = cuda_only_calls()
    cfg, plan = engine_config(tiny_model_path, extra=megatron(1, recompute=True))
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=True)
        assert_originals(originals)
        seen = []  # torch.cuda.current_device() as each forward of the first layer saw it
        group.worker.actor.model.decoder.layers[0].register_forward_hook(
            lambda *_: seen.append(torch.cuda.current_device()))
        torch.manual_seed(0)
        out = group.generate_sequences(prompt_batch(tiny_model_path))
        group.compute_log_probs(out)
        group.compute_ref_log_probs(out)
        assert_originals(originals)
        metrics = group.update_actor(with_training_fields(out))[0]
        assert metrics["grad_norm"] > 0
        assert_originals(originals)
        engine = group.worker.actor
        engine.backward(engine.forward(out, grad=True).log_probs.sum())  # outside the schedule: the same
        assert_originals(originals)
        assert seen and set(seen) == {"cpu"}
        dict(full_weights(engine))
        assert_originals(originals)
    finally:
        group.shutdown()
    assert_originals(originals)


def test_cpu_redirections_nest_and_may_close_out_of_order():
    from rlplat.engines.megatron import cpu

    originals = cuda_only_calls()
    outer, inner = cpu.redirected(), cpu.redirected()
    outer.__enter__()
    inner.__enter__()
    assert torch.cuda.current_device() == "cpu"
    from megatron.core.transformer.moe import moe_utils

    assert moe_utils.te_general_gemm is None  # TransformerEngine is not installed: a router's plain matmul
    outer.__exit__(None, None, None)
    assert torch.cuda.current_device() == "cpu"  # the inner block is still open
    inner.__exit__(None, None, None)
    assert_originals(originals)
    with cpu.building():
        assert torch.ones(1).cuda().device.type == "cpu"
    assert_originals(originals)
    assert "cuda" not in vars(torch.Tensor)  # inherited from torch's C base class, as before


def test_an_unknown_megatron_core_release_is_one_config_line(monkeypatch):
    """The CPU support redirects private functions of megatron-core 0.16: another release is refused at
    start-up, and the redirections refuse to install."""
    from rlplat.engines.megatron import cpu

    monkeypatch.setattr(cpu, "megatron_version", lambda: "0.17.0")
    with pytest.raises(ConfigError) as err:
        load_run_config(["actor.strategy=megatron", "trainer.device=cpu"])
    assert str(err.value).startswith("actor.strategy=megatron on cpu: megatron-core 0.17.0 is installed; rlplat "
                                     "runs Megatron-Core on CPU only with 0.16.x"), str(err.value)
    assert "\n" not in str(err.value)
    originals = cuda_only_calls()
    with pytest.raises(RuntimeError, match="megatron-core 0.17.0 is installed"):
        with cpu.redirected():
            pass
    assert_originals(originals)
