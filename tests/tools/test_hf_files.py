"""rlplat.models.hf_files.save_hf_model: weights streamed in buckets become a Hugging Face model directory
(several safetensors files and their index when they exceed one file) that transformers loads, the writer
holding at most one file's tensors at a time; bad weights are one error and leave nothing behind. The tokenizer
it copies is loaded as every part of a run loads it (rlplat.models.tokenizer)."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlplat.models.hf_files import EXPORT_TEMP_PREFIX, save_hf_model

MODEL_CFG = OmegaConf.create({"trust_remote_code": False, "tokenizer_path": None})


def trained(model_path) -> dict[str, torch.Tensor]:
    """The tiny model's weights, changed, so that a directory holding the original cannot pass."""
    state = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()
    return {name: tensor + 0.01 for name, tensor in state.items()}


def test_buckets_become_shards_that_load_as_the_model(tiny_model_path, tmp_path):
    weights = trained(tiny_model_path)
    out, shard_bytes = tmp_path / "model", 300_000
    held = []  # bytes received but not yet in a file, each time the writer asks for the next bucket

    def buckets():
        received = 0
        for name, tensor in weights.items():
            on_disk = sum(f.stat().st_size for f in tmp_path.glob(f"{EXPORT_TEMP_PREFIX}*/part-*.safetensors"))
            held.append(received - on_disk)
            yield [(name, tensor)]
            received += tensor.numel() * 4 if name != "lm_head.weight" else 0  # tied: not written

    save_hf_model(buckets(), out, tiny_model_path, MODEL_CFG, shard_bytes=shard_bytes)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert "lm_head.weight" not in index["weight_map"]  # tied to the embedding, as save_pretrained leaves it
    for name in files:
        tensors = load_file(out / name)
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        assert size <= shard_bytes or len(tensors) == 1
    # the safetensors header makes a file a little larger than its tensors
    assert max(held) <= shard_bytes + 4 * max(t.numel() for t in weights.values())
    assert not list(tmp_path.glob(f"{EXPORT_TEMP_PREFIX}*"))
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in weights.items())
    assert (out / "tokenizer_config.json").is_file() and (out / "generation_config.json").is_file()

    save_hf_model([list(weights.items())], out, tiny_model_path, MODEL_CFG, dtype=torch.bfloat16)  # replaces it
    assert sorted(p.name for p in out.glob("*.safetensors*")) == ["model.safetensors"]
    assert AutoModelForCausalLM.from_pretrained(out).dtype == torch.bfloat16


@pytest.mark.parametrize("change, message", [
    (lambda w: {**w, "model.extra.weight": torch.zeros(2)},
     "the weights given hold 'model.extra.weight', which the model's architecture has no place for"),
    (lambda w: {**w, "model.norm.weight": torch.zeros(3)},
     "the weight 'model.norm.weight' has shape (3,); the model's architecture expects (128,)"),
    (lambda w: {k: v for k, v in w.items() if k != "model.norm.weight"},
     "lack 1 tensors, e.g. ['model.norm.weight']"),
])
def test_bad_weights_are_one_error_and_leave_the_old_model(tiny_model_path, tmp_path, change, message):
    weights = trained(tiny_model_path)
    out = tmp_path / "model"
    save_hf_model([list(weights.items())], out, tiny_model_path, MODEL_CFG)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        save_hf_model([list(change(weights).items())], out, tiny_model_path, MODEL_CFG)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary directory left
    with pytest.raises(ValueError, match="the weight 'model.norm.weight' is given twice"):
        save_hf_model([list(weights.items()), [("model.norm.weight", weights["model.norm.weight"])]],
                      tmp_path / "twice", tiny_model_path, MODEL_CFG)
    assert not (tmp_path / "twice").exists()


def test_a_tokenizer_of_the_models_own_code_loads_with_model_trust_remote_code(tmp_path):
    # the tokenizer's class is the model directory's own code (its tokenizer_config.json's auto_map): refused
    # without model.trust_remote_code, loaded with it, everywhere the policy's tokenizer is loaded (and exported)
    from rlplat.models.tiny import build_tokenizer
    from rlplat.models.tokenizer import load_tokenizer

    build_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "own_tokenizer.py").write_text(
        "from transformers import PreTrainedTokenizerFast\n\n\nclass OwnTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="OwnTokenizer", auto_map={"AutoTokenizer": [None, "own_tokenizer.OwnTokenizer"]})
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    model = OmegaConf.create({"tokenizer_path": None, "trust_remote_code": False})
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_tokenizer(model, str(tmp_path))
    model.trust_remote_code = True
    assert type(load_tokenizer(model, str(tmp_path))).__name__ == "OwnTokenizer"


def test_model_chat_template_replaces_the_tokenizers_by_name_file_or_text(tmp_path):
    """model.chat_template: a named template, a file, or the template itself renders the prompts in place of the
    tokenizer's own; anything else is one error naming the key and the forms it takes."""
    from rlplat.config.errors import ConfigError
    from rlplat.models.chat_template import resolve_chat_template
    from rlplat.models.tiny import build_tokenizer
    from rlplat.models.tokenizer import load_tokenizer

    build_tokenizer().save_pretrained(tmp_path / "tok")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+2?"}]

    def rendered(template):
        model = OmegaConf.create({"tokenizer_path": None, "trust_remote_code": False, "chat_template": template})
        tokenizer = load_tokenizer(model, str(tmp_path / "tok"))
        return tokenizer, tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    own, default = rendered(None)
    _, chatml = rendered("chatml")
    assert chatml == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n1+2?<|im_end|>\n<|im_start|>assistant\n"
    assert chatml != default
    _, tulu = rendered("tulu")
    assert tulu == "<|system|>\nbe brief\n<|user|>\n1+2?\n<|assistant|>\n"
    answered = [*messages, {"role": "assistant", "content": "3"}]
    zephyr = load_tokenizer(OmegaConf.create({"tokenizer_path": None, "trust_remote_code": False,
                                              "chat_template": "zephyr"}), str(tmp_path / "tok"))
    eos = zephyr.eos_token
    assert zephyr.apply_chat_template(answered, tokenize=False) == \
        f"<|system|>\nbe brief{eos}\n<|user|>\n1+2?{eos}\n<|assistant|>\n3{eos}\n"
    (tmp_path / "mine.jinja").write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}")
    assert rendered(str(tmp_path / "mine.jinja"))[1] == "[system] be brief [user] 1+2? "
    assert rendered("{{ messages[-1]['content'] }}!")[1] == "1+2?!"
    for bad, why in [("chatlm", "not a named template \\(chatml, tulu, zephyr\\), not a file"),
                     (str(tmp_path / "tok" / "tokenizer_config.json"), "the file holds no Jinja template")]:
        with pytest.raises(ConfigError, match=f"model.chat_template=.*{why}"):
            resolve_chat_template(bad)
    assert own.chat_template is not None  # the tiny tokenizer has a template of its own, which None keeps
