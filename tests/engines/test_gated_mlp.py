"""The gated MLP that recomputes its product in the backward pass: the same outputs and gradients as the
model's own forward, with less kept for the backward pass, and only where the block is exactly that."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, Olmo2Config, Olmo2ForCausalLM, Qwen2Config, \
    Qwen2ForCausalLM

from rlplat.engines.gated_mlp import GatedMLP, install_gated_mlp


def _qwen2(**overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, **overrides)
    return Qwen2ForCausalLM(config).float()


def _train_pass(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """Logits, gradients by name, and the bytes of the distinct storages autograd kept for the backward pass."""
    kept: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        kept[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = model(input_ids=ids).logits
    logits.log_softmax(-1).gather(-1, ids[..., None]).sum().backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}, sum(kept.values())


def test_same_outputs_and_gradients_with_less_kept_for_the_backward_pass(tiny_model_path):
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    lean = copy.deepcopy(plain)
    layers = plain.config.num_hidden_layers
    assert install_gated_mlp(lean) == layers
    ids = torch.randint(0, plain.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(0))

    logits, grads, kept = _train_pass(plain, ids)
    lean_logits, lean_grads, lean_kept = _train_pass(lean, ids)

    torch.testing.assert_close(lean_logits, logits, rtol=0, atol=0)
    assert grads.keys() == lean_grads.keys()
    for name in grads:
        torch.testing.assert_close(lean_grads[name], grads[name], rtol=1e-6, atol=1e-9, msg=name)
    # silu(gate(x)) and the product are no longer kept: two [tokens, ffn] float32 tensors per layer
    assert kept - lean_kept == 2 * layers * ids.numel() * plain.config.intermediate_size * 4


def test_bfloat16_gradients_match_the_models_own():
    plain = _qwen2().to(torch.bfloat16)
    lean = copy.deepcopy(plain)
    install_gated_mlp(lean)
    ids = torch.arange(16).reshape(2, 8)
    logits, grads, _ = _train_pass(plain, ids)
    lean_logits, lean_grads, _ = _train_pass(lean, ids)
    torch.testing.assert_close(lean_logits, logits, rtol=0, atol=0)
    for name in grads:
        torch.testing.assert_close(lean_grads[name], grads[name], rtol=1e-2, atol=1e-5, msg=name)


def test_frozen_weights_and_inference_pass_through():
    model = _qwen2()
    install_gated_mlp(model)
    model.requires_grad_(False)
    ids = torch.arange(12).reshape(2, 6)
    embeds = model.get_input_embeddings()(ids).requires_grad_(True)  # gradients reach the input, not the weights
    model(inputs_embeds=embeds).logits.sum().backward()
    assert embeds.grad is not None and embeds.grad.abs().sum() > 0
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()


def _olmo2() -> torch.nn.Module:
    torch.manual_seed(0)
    return Olmo2ForCausalLM(Olmo2Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2))


@pytest.mark.parametrize("build, expected", [
    (_olmo2, 1),
    (lambda: _qwen2(hidden_act="gelu"), 0),
    (lambda: GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=30)), 0),
])
def test_only_exactly_this_block_is_replaced(build, expected):
    model = build()
    assert install_gated_mlp(model) == expected
    assert sum(type(module) is GatedMLP for module in model.modules()) == expected
    assert not any("forward" in vars(module) for module in model.modules())  # no instance is patched


def test_the_replacement_keeps_the_parameters_and_their_names(tiny_model_path):
    """The same parameter objects under the same names: state dicts, checkpoints and weight sync see no change."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    before = dict(model.named_parameters())
    keys = list(model.state_dict())
    replaced = [model.model.layers[i].mlp for i in range(model.config.num_hidden_layers)]
    assert install_gated_mlp(model) == len(replaced)
    assert dict(model.named_parameters()) == before  # nn.Parameter compares by identity
    assert list(model.state_dict()) == keys
    for layer, old in zip(model.model.layers, replaced):
        assert type(layer.mlp) is GatedMLP and layer.mlp is not old
        assert type(old).__name__ == "Qwen2MLP" and "forward" not in vars(old)  # the old block is untouched
