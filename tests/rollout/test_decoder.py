"""The HF rollout engine's dense forward (rlplat.rollout.decoder) against the model's own forward: the same
logits for Qwen2 and Llama, the same samples through the whole sampling loop (stops, compaction), and the
model's forward for what it does not compute exactly."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from rlplat.controller import InProcessWorkerGroup
from rlplat.rollout.decoder import DenseForward, ModelForward, matches_model
from rlplat.workers.roles import ActorRolloutRefWorker
from workers.helpers import engine_config, prompt_batch


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory, tiny_model_path):
    """The tiny model's tokenizer with a Llama of untied embeddings, biased attention and a llama3 rope."""
    import shutil

    path = tmp_path_factory.mktemp("llama") / "model"
    shutil.copytree(tiny_model_path, path)
    for name in ("model.safetensors", "config.json"):
        (path / name).unlink()
    config = LlamaConfig(vocab_size=104, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, attention_bias=True, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 64},
                         max_position_embeddings=512, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("which", ["qwen2", "llama"])
def test_dense_forward_gives_the_models_logits(which, tiny_model_path, llama_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path if which == "qwen2" else llama_path,
                                                 dtype=torch.float32).eval()
    forward = DenseForward.of(model)
    assert isinstance(forward, DenseForward)  # both architectures are ones it computes exactly
    assert matches_model(forward, model, 1e-5) is None


def sample(model_path: str, dense: bool):
    cfg, plan = engine_config(model_path, extra=["data.max_response_length=12", f"rollout.hf.dense_forward={dense}"])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(model_path, with_ref=False)
        assert isinstance(group.worker.rollout.forward, DenseForward if dense else ModelForward)
        torch.manual_seed(3)
        out = group.generate_sequences(prompt_batch(model_path, temperature=1.3).repeat(4))
        # the key/value cache is dropped when the rollout returns, not held through the update
        assert held_state(group.worker.rollout.forward) == []
        return out
    finally:
        group.shutdown()


def held_state(forward) -> list[str]:
    """The per-batch state a forward holds: its tensors and transformers caches (its model aside)."""
    return [name for name, value in vars(forward).items()
            if isinstance(value, torch.Tensor) or type(value).__name__.endswith("Cache")]


@pytest.mark.parametrize("which", ["qwen2", "llama"])
def test_the_sampling_loop_draws_the_same_responses_either_way(which, tiny_model_path, llama_path):
    """32 rows at a high temperature: some stop early (the batch is compacted), others run to the limit."""
    path = tiny_model_path if which == "qwen2" else llama_path
    dense, model = sample(path, True), sample(path, False)
    lengths = dense.tensors["response_mask"].sum(-1)
    assert lengths.min() < 12 and lengths.max() == 12  # compaction and full-length rows both happened
    assert torch.equal(dense.tensors["responses"], model.tensors["responses"])
    torch.testing.assert_close(dense.tensors["rollout_log_probs"], model.tensors["rollout_log_probs"],
                               atol=1e-5, rtol=0)


def test_a_model_it_does_not_compute_exactly_keeps_the_models_forward(tiny_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    model.model.rotary_emb.rope_type = "dynamic"  # frequencies that depend on the sequence length
    assert DenseForward.of(model) is None


def test_a_dense_forward_that_disagrees_is_not_used(tiny_model_path, monkeypatch, capsys):
    import rlplat.rollout.decoder as decoder

    monkeypatch.setattr(decoder, "_rotate", lambda x, cos, sin: x)  # no rotary embedding: other logits
    cfg, plan = engine_config(tiny_model_path)
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=False)
        assert isinstance(group.worker.rollout.forward, ModelForward)
    finally:
        group.shutdown()
    assert "the dense forward's logits differ from Qwen2ForCausalLM's" in capsys.readouterr().out
