"""Tiny causal LMs and character tokenizers built locally, saved in Hugging Face format.

No model can be downloaded at run time on our machines, so tests and the embedded default build a
small Qwen2 model and a character-level tokenizer here and ``save_pretrained`` both: everything after
that goes through the real ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained`` path.

The tokenizer is character-level (one token per character of a fixed alphabet) with chat-role
special tokens and a chat template, which is enough for arithmetic-style built-in tasks.
"""

from __future__ import annotations

import string
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import torch

from rlplat.utils.files import plain_modes

PAD, EOS, BOS = "<|pad|>", "<|endoftext|>", "<|bos|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"
# Tools (tools=, OpenAI-style schemas) are listed in a system line as name(arguments); a tool's result is a
# message of role "tool". Without tools the rendering is the same as before they existed.
CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|system|>tools: ' }}{% for tool in tools %}{% set f = tool['function'] %}"
    "{{ (', ' if not loop.first else '') + f['name'] + '(' + (f['parameters']['properties'] | list | join(', ')) + ')' }}"
    "{% endfor %}{{ '<|endoftext|>' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|endoftext|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
# The vision-language variant's: Qwen-VL's vision tokens, and a message's content may be a list of parts, an
# image part rendered as Qwen-VL renders it (rlplat.data.vision expands its image token to the image's tokens).
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
VISION_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|endoftext|>' }}",
    "{{ '<|' + message['role'] + '|>' }}{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}{% else %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{{ '<|endoftext|>' }}")


@dataclass(frozen=True)
class TinyModelSpec:
    """Architecture of a tiny Qwen2. head_dim = hidden_size / num_heads must be >= 32 (vLLM's CPU
    attention rejects 16)."""

    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 1024  # room for data.max_prompt_length (512) + a response
    tie_word_embeddings: bool = True


@dataclass(frozen=True)
class TinyMoESpec(TinyModelSpec):
    """Architecture of a tiny Qwen3-MoE: the attention of :class:`TinyModelSpec`, and every decoder layer's MLP
    ``num_experts`` small gated MLPs, of which a router picks ``num_experts_per_tok`` per token
    (``intermediate_size`` would be a dense layer's MLP: there is none)."""

    moe_intermediate_size: int = 128  # one expert's MLP (top-2: as wide as the embedded dense model's MLP in all)
    num_experts: int = 8
    num_experts_per_tok: int = 2
    norm_topk_prob: bool = True  # the chosen experts' gate weights renormalised to sum to 1 (Qwen3-MoE's)
    router_aux_loss_coef: float = 0.001  # the load-balancing loss's weight (Qwen3-MoE's default)
    model_type: ClassVar[str] = "qwen3_moe"  # what the built model's config says


@dataclass(frozen=True)
class TinyVisionSpec:
    """Architecture of a tiny Qwen2.5-VL: the language model of :class:`TinyModelSpec` with 3-D rotary positions
    (mRoPE: ``mrope_section`` splits each head's 16 frequency pairs over time, height and width), and a
    two-block vision transformer over 14-pixel patches whose 2 x 2 merged patches become one image token.
    Its image processor resizes images to between ``min_pixels`` and ``max_pixels`` (a 112 x 112 image: 64
    patches, 16 image tokens)."""

    text: TinyModelSpec = TinyModelSpec()
    mrope_section: tuple[int, int, int] = (4, 6, 6)
    vision_depth: int = 2
    vision_hidden_size: int = 64
    vision_heads: int = 2
    vision_intermediate_size: int = 128
    patch_size: int = 14
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 112 * 112
    model_type: ClassVar[str] = "qwen2_5_vl"  # what the built model's config says (rlplat.models.vision.is_vision)


def build_tokenizer(extra_specials: tuple[str, ...] = (), chat_template: str = CHAT_TEMPLATE):
    """A character-level ``PreTrainedTokenizerFast`` with pad/eos/role tokens (and ``extra_specials``, after
    the alphabet: the ids of the plain tokenizer's tokens do not change) and a chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, EOS, BOS, *ROLE_TOKENS]
    vocab = {tok: i for i, tok in enumerate(specials + ["<unk>"] + list(ALPHABET) + list(extra_specials))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials + list(extra_specials))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token="<unk>",
        additional_special_tokens=[*ROLE_TOKENS, *extra_specials],
        chat_template=chat_template,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def build_tiny_model(out_dir: str | Path, spec: TinyModelSpec | TinyMoESpec | TinyVisionSpec = TinyModelSpec(),
                     seed: int = 0) -> Path:
    """Build a randomly initialised tiny model (a Qwen2 for a :class:`TinyModelSpec`, a Qwen3-MoE for a
    :class:`TinyMoESpec`, a Qwen2.5-VL for a :class:`TinyVisionSpec`) + tokenizer and save both to ``out_dir``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    if isinstance(spec, TinyVisionSpec):
        return build_tiny_vision_model(out_dir, spec, seed)
    out_dir = Path(out_dir)
    tokenizer = build_tokenizer()
    moe = isinstance(spec, TinyMoESpec)
    config = (Qwen3MoeConfig if moe else Qwen2Config)(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        dtype="float32",
        **asdict(spec),
    )
    torch.manual_seed(seed)
    model = (Qwen3MoeForCausalLM if moe else Qwen2ForCausalLM)(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    for weights in out_dir.glob("*.safetensors*"):  # save_pretrained writes the weights private
        plain_modes(weights)
    return out_dir


def build_tiny_vision_model(out_dir: str | Path, spec: TinyVisionSpec = TinyVisionSpec(), seed: int = 0) -> Path:
    """Build a randomly initialised tiny Qwen2.5-VL (:class:`TinyVisionSpec`), the character tokenizer with
    Qwen-VL's vision tokens, and its image processor, and save them to ``out_dir``."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    out_dir = Path(out_dir)
    tokenizer = build_tokenizer(VISION_TOKENS, VISION_CHAT_TEMPLATE)
    token = dict(zip(("vision_start", "vision_end", "image", "video"), tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    text = {key: value for key, value in asdict(spec.text).items() if key != "tie_word_embeddings"}
    text.update(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.bos_token_id)
    config = Qwen2_5_VLConfig(
        text_config=dict(**text, vocab_size=len(tokenizer), rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(spec.mrope_section)}),
        vision_config=dict(depth=spec.vision_depth, hidden_size=spec.vision_hidden_size, num_heads=spec.vision_heads,
                           intermediate_size=spec.vision_intermediate_size, out_hidden_size=spec.text.hidden_size,
                           patch_size=spec.patch_size, spatial_merge_size=spec.spatial_merge_size,
                           temporal_patch_size=spec.temporal_patch_size, window_size=spec.patch_size * 4,
                           fullatt_block_indexes=[spec.vision_depth - 1]),
        image_token_id=token["image"], video_token_id=token["video"], vision_start_token_id=token["vision_start"],
        vision_end_token_id=token["vision_end"], tie_word_embeddings=spec.text.tie_word_embeddings, dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    images = Qwen2VLImageProcessorPil(min_pixels=spec.min_pixels, max_pixels=spec.max_pixels,
                                      patch_size=spec.patch_size, merge_size=spec.spatial_merge_size,
                                      temporal_patch_size=spec.temporal_patch_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    images.save_pretrained(out_dir)
    plain_modes(out_dir)
    return out_dir


def build_tiny_reward_model(out_dir: str | Path, marker: str = "7", steps: int = 300, seed: int = 0) -> float:
    """Train a tiny Qwen2 sequence-classification reward model (one logit) that scores an arithmetic
    answer high when the response contains ``marker`` and low otherwise, and save it with the character
    tokenizer to ``out_dir``. Trained on random ``a+b=`` prompts with random digit responses, half of them
    with every ``marker`` removed (binary cross-entropy, ``steps`` batches of 64). Returns its accuracy on
    512 fresh examples (1.0 for the defaults, in ~5 s on a CPU core)."""
    import random

    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = build_tokenizer()
    tokenizer.padding_side = "right"
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
                         pad_token_id=tokenizer.pad_token_id, num_labels=1, dtype="float32")
    model = Qwen2ForSequenceClassification(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    def batch(n: int) -> tuple[dict, torch.Tensor]:
        texts, labels = [], []
        for _ in range(n):
            response = "".join(rng.choice(string.digits) for _ in range(rng.randint(1, 4)))
            if rng.random() < 0.5:
                response = response.replace(marker, "") or ("1" if marker != "1" else "2")
            prompt = f"{rng.randint(0, 99)}+{rng.randint(0, 99)}="
            texts.append(tokenizer.apply_chat_template([{"role": "user", "content": prompt},
                                                        {"role": "assistant", "content": response}], tokenize=False))
            labels.append(float(marker in response))
        return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False), torch.tensor(labels)

    for _ in range(steps):
        encoded, labels = batch(64)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(**encoded).logits[:, 0], labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    encoded, labels = batch(512)
    with torch.no_grad():
        accuracy = ((model(**encoded).logits[:, 0] > 0).float() == labels).float().mean().item()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    plain_modes(out_dir)
    return accuracy
