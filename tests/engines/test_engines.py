"""Engines and workers for real: FSDP2 over gloo, the HF rollout engine, weight sync, the critic.

The same checks run in-process (world size 1, no Ray) and, for sharding, on a 2-worker Ray group.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlplat.controller import InProcessWorkerGroup, RayWorkerGroup, ResourcePool
from rlplat.workers.roles import ActorRolloutRefWorker, CriticWorker

from workers.helpers import check_rollout_layout, engine_config, full_weights, prompt_batch, reference_log_probs, single_process_step, with_training_fields


@pytest.fixture
def inprocess_group(tiny_model_path):
    cfg, plan = engine_config(tiny_model_path)
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    group.init_model(tiny_model_path, with_ref=True)
    yield group, cfg, plan
    group.shutdown()


def test_inprocess_rollout_shapes_and_log_probs_match_training(inprocess_group, tiny_model_path):
    group, cfg, _ = inprocess_group
    worker = group.worker
    prompts = prompt_batch(tiny_model_path, temperature=0.7)
    torch.manual_seed(0)
    out = group.generate_sequences(prompts)
    tok_eos = worker.rollout.eos_token_id
    check_rollout_layout(out, prompts, tok_eos, worker.rollout.pad_token_id, cfg.data.max_response_length)
    assert out.meta["temperature"] == 0.7
    recomputed = group.compute_log_probs(out).tensors["old_log_probs"]
    mask = out.tensors["response_mask"].bool()
    torch.testing.assert_close(recomputed[mask], out.tensors["rollout_log_probs"][mask], atol=1e-4, rtol=0)
    # and both equal an independent, unsharded transformers model
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        expected = reference_log_probs(plain, out, 0.7)
    torch.testing.assert_close(recomputed[mask], expected[mask], atol=1e-5, rtol=0)
    ref = group.compute_ref_log_probs(out).tensors["ref_log_probs"]
    torch.testing.assert_close(ref[mask], expected[mask], atol=1e-5, rtol=0)
    # Σπ² for the optimal token baselines, from the same forward
    fwd = worker.actor.forward(out, temperature=0.7, need_sum_pi_squared=True)
    with torch.no_grad():
        logits = plain(input_ids=out.tensors["input_ids"], attention_mask=out.tensors["attention_mask"],
                       position_ids=out.tensors["position_ids"]).logits[:, -cfg.data.max_response_length - 1 : -1]
    torch.testing.assert_close(fwd.sum_pi_squared, torch.softmax(logits / 0.7, -1).square().sum(-1), atol=1e-6, rtol=0)


def test_one_worker_rollout_reads_the_actors_weights_without_a_copy(inprocess_group, tiny_model_path):
    group, _, _ = inprocess_group
    worker = group.worker
    live = worker.actor.live_weights()
    rollout = worker.rollout.model.state_dict()
    assert set(live) == set(rollout) and all(rollout[k].data_ptr() == live[k].data_ptr() for k in live)
    out = group.generate_sequences(prompt_batch(tiny_model_path))
    group.update_actor(with_training_fields(out))
    synced = group.generate_sequences(prompt_batch(tiny_model_path))
    assert synced.meta["weight_sync_s"] < 0.01  # nothing to copy
    trained = dict(full_weights(worker.actor))
    for name, tensor in worker.rollout.model.state_dict().items():
        assert torch.equal(tensor, trained[name])  # the update is what the rollout samples from
    updated = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    updated.load_state_dict(trained)
    ids = out.tensors["input_ids"][:2]
    with torch.no_grad():
        torch.testing.assert_close(worker.rollout.model(ids).logits, updated(ids).logits, atol=1e-5, rtol=0)


def test_inprocess_update_then_rollout_moves_rollout_to_new_weights(inprocess_group, tiny_model_path, monkeypatch):
    group, _, _ = inprocess_group
    worker = group.worker
    # the copying path (several workers, or dtypes that differ): the rollout engine holds its own weights
    monkeypatch.setattr(worker.rollout, "share_weights", lambda weights: False)
    worker.rollout.model.load_state_dict({k: v.clone() for k, v in worker.rollout.model.state_dict().items()},
                                         assign=True)  # its own copy again
    out = group.generate_sequences(prompt_batch(tiny_model_path))
    assert out.meta["weight_sync_s"] == 0.0  # nothing changed since the engine loaded the model
    before = {k: v.clone() for k, v in worker.rollout.model.state_dict().items()}
    metrics = group.update_actor(with_training_fields(out))[0]
    assert metrics["grad_norm"] > 0 and "actor/pg_loss" in metrics and "actor/kl_loss" in metrics
    assert worker.weights_stale and all(torch.equal(v, worker.rollout.model.state_dict()[k]) for k, v in before.items())
    synced = group.generate_sequences(prompt_batch(tiny_model_path))  # the next rollout sends the weights
    assert synced.meta["weight_sync_s"] > 0 and not worker.weights_stale
    after = worker.rollout.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the rollout model changed
    trained = dict(full_weights(worker.actor))
    for name, tensor in after.items():
        torch.testing.assert_close(tensor, trained[name])
    # the rollout engine's logits are the updated model's
    updated = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    updated.load_state_dict(trained)
    ids = out.tensors["input_ids"][:2]
    with torch.no_grad():
        torch.testing.assert_close(worker.rollout.model(ids).logits, updated(ids).logits, atol=1e-5, rtol=0)
    # the reference policy did not move
    ref_weights = dict(full_weights(worker.ref))
    assert torch.equal(ref_weights["model.norm.weight"], before["model.norm.weight"])


def test_inprocess_critic_values_and_update(tiny_model_path):
    cfg, plan = engine_config(tiny_model_path, extra=["algorithm=ppo", "critic.optim.lr=3e-3"])
    group = InProcessWorkerGroup(CriticWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path)
        rollout = prompt_batch(tiny_model_path)
        # fake responses: the critic only needs the layout
        from rlplat.rollout.base import assemble_rollout

        responses = torch.randint(10, 20, (len(rollout), 8))
        mask = torch.ones(len(rollout), 8, dtype=torch.long)
        mask[0, 5:] = 0
        batch = assemble_rollout(rollout, responses, mask, torch.zeros(len(rollout), 8))
        values = group.compute_values(batch).tensors["values"]
        assert values.shape == (8, 8) and (values[0, 5:] == 0).all()
        returns = torch.ones(8, 8) * mask
        train = batch.union(type(batch).from_dict({"values": values, "returns": returns}))
        losses = [group.update_critic(train)[0]["critic/vf_loss"] for _ in range(8)]
        assert losses[-1] < 0.5 * losses[0], losses  # the value head learns to predict the constant return
    finally:
        group.shutdown()


@pytest.fixture(scope="module")
def untied_model_path(tmp_path_factory):
    """The tiny model with an output layer of its own (not the input embedding)."""
    from rlplat.models.tiny import TinyModelSpec, build_tiny_model

    spec = TinyModelSpec(tie_word_embeddings=False)
    return str(build_tiny_model(tmp_path_factory.mktemp("untied") / "model", spec, seed=0))


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["tied", "untied"])
def test_two_ray_workers_fsdp_matches_unsharded(ray_cluster, request, weights):
    """The output layer's weight (tied to the embedding or its own) is a sharded parameter of the root module,
    gathered by its forward, where the chunked token outputs use it; its gradient is reduced like the rest."""
    tiny_model_path = request.getfixturevalue("tiny_model_path" if weights == "tied" else "untied_model_path")
    cfg, plan = engine_config(tiny_model_path, workers=2)
    pool = ResourcePool(nnodes=1, workers_per_node=2, device="cpu").create()
    group = RayWorkerGroup(ActorRolloutRefWorker, pool, cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=True)
        torch.manual_seed(0)
        out = group.generate_sequences(prompt_batch(tiny_model_path, temperature=1.0))
        assert len(out) == 8
        sharded = group.compute_log_probs(out).tensors["old_log_probs"]
        plain = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        with torch.no_grad():
            expected = reference_log_probs(plain, out, 1.0)
        mask = out.tensors["response_mask"].bool()
        torch.testing.assert_close(sharded[mask], expected[mask], atol=1e-5, rtol=0)

        train = with_training_fields(out)
        group.update_actor(train)
        per_rank = group.actor_weights()
        assert len(per_rank) == 2
        reference = single_process_step(tiny_model_path, cfg, train, plan.loss_scale_factor)
        for name, tensor in reference.items():
            torch.testing.assert_close(per_rank[0][name], per_rank[1][name], atol=0, rtol=0)
            torch.testing.assert_close(per_rank[0][name], tensor, atol=1e-5, rtol=1e-5)
        # The rollout's weight stream: 64 KiB buckets (one all-gather each, ~20 of them), cast to bf16
        # before gathering, unpack to exactly the cast full weights on both ranks.
        bf16 = group.actor_weights(dtype="bfloat16", bucket_bytes=64 * 2**10)
        for rank in range(2):
            assert bf16[rank].keys() == per_rank[0].keys()
            for name, tensor in per_rank[0].items():
                assert bf16[rank][name].dtype == torch.bfloat16
                torch.testing.assert_close(bf16[rank][name], tensor.to(torch.bfloat16), atol=0, rtol=0)
        # ref.sync_steps: each rank blends its own shard of the colocated reference (Polyak 0.5): the
        # reference's log-probs are those of a plain model holding the mixed weights
        group.sync_reference(0.5)
        plain.load_state_dict({name: 0.5 * t + 0.5 * per_rank[0][name] for name, t in plain.state_dict().items()})
        with torch.no_grad():
            expected = reference_log_probs(plain, out, 1.0)
        got = group.compute_ref_log_probs(out).tensors["ref_log_probs"]
        torch.testing.assert_close(got[mask], expected[mask], atol=1e-5, rtol=0)
    finally:
        group.shutdown()
        pool.release()


@pytest.mark.parametrize("lora", [[], ["model.lora.rank=4"]], ids=["full", "lora"])
def test_gradient_checkpointing_recomputes_and_changes_nothing_else(tiny_model_path, lora):
    """model.gradient_checkpointing=true: each decoder layer's MLP runs twice per micro-batch (forward and
    the recompute in backward), and the update equals the one without it (with LoRA adapters too: the merged
    weights compared)."""
    weights, mlp_calls = {}, {}
    for on in (False, True):
        cfg, plan = engine_config(tiny_model_path, extra=[f"model.gradient_checkpointing={str(on).lower()}", *lora])
        group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
        try:
            group.init_model(tiny_model_path, with_ref=False)
            torch.manual_seed(0)
            train = with_training_fields(group.generate_sequences(prompt_batch(tiny_model_path)))
            mlp = group.worker.actor.model.model.layers[0].mlp
            calls = []
            handle = mlp.register_forward_pre_hook(lambda *_: calls.append(1))  # a recompute may stop early
            group.update_actor(train)
            handle.remove()
            mlp_calls[on], weights[on] = len(calls), group.actor_weights()[0]
        finally:
            group.shutdown()
    micro_batches = 8 // cfg.actor.micro_batch_size_seqs_per_worker
    assert (mlp_calls[False], mlp_calls[True]) == (micro_batches, 2 * micro_batches)
    for name, tensor in weights[False].items():
        torch.testing.assert_close(weights[True][name], tensor, atol=1e-6, rtol=0)
