"""Vision-language models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): loading them, their 3-D rotary positions, their
vision tower.

A Qwen-VL model places each text token at one position and each image token at a (time, height, width)
position of its image's patch grid (multimodal rotary embedding, mRoPE; Qwen2-VL report, Wang et al. 2024,
sec. 2.1): the text after an image continues from the largest position the image used, so a sequence's
positions are not its token indices. :func:`rope_positions` computes them with the model's own
``get_rope_index`` for each row's real tokens, as ``[B, L, 3]`` (rows first, so packing and row splits
treat them like any per-token field); :func:`model_positions` lays them out as the model takes them.

Each row's image inputs travel with the batch as the non-tensor field ``multi_modal_inputs`` (a dict with
``pixel_values`` and ``image_grid_thw``, or None for a row without images, rlplat.data.vision);
:func:`image_inputs` joins a forward pass's rows' inputs in the order their image tokens appear.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlplat.data.vision import ImageInputs

VISION_TOWER = "visual"  # the vision encoder's module name in Qwen-VL models (model.visual)
QWEN_VL = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl"})  # the model types rlplat trains with images


def is_vision(config) -> bool:
    """Whether ``config`` is a vision-language model rlplat trains with images (the Qwen-VL family; another
    model with a vision encoder runs as the text model it also is, as it did before)."""
    return getattr(config, "model_type", None) in QWEN_VL


def auto_model_class(config):
    """The transformers auto class that loads ``config``'s generative model: image-text-to-text for a
    vision-language model (AutoModelForCausalLM does not map them), else causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision(config) else AutoModelForCausalLM


def load_generative(path: str, **kwargs) -> torch.nn.Module:
    """``from_pretrained`` of the model directory ``path`` with the auto class of its config."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=kwargs.get("trust_remote_code", False))
    return auto_model_class(config).from_pretrained(path, **kwargs)


def image_inputs_of(path: str, tokenizer, data_cfg, trust_remote_code: bool = False) -> ImageInputs | None:
    """The image inputs of the model ``path`` (a directory or hub id) when it is a vision-language model, else
    None (a text model: a row with images is then an error, rlplat.data.dataset)."""
    from transformers import AutoConfig

    if not is_vision(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)):
        return None
    return ImageInputs.load(path, tokenizer, data_cfg)


def vision_token_ids(config) -> list[int]:
    """The ids of the tokens that stand for images and videos in a prompt. A response never holds them (one would
    read as an image's place): the policy of a vision-language model is its softmax over the other tokens
    (:func:`without_vision_tokens`), which every rollout engine samples from and the trainer scores."""
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return [i for i in (getattr(config, name, None) for name in names) if i is not None]


def without_vision_tokens(logits: torch.Tensor, vision_tokens: torch.Tensor) -> torch.Tensor:
    """``logits`` ``[..., V]`` with the vision tokens' set to -1e9: probability 0 under any temperature, and finite
    (an entropy's ``p * logit`` stays 0, where -inf would give NaN)."""
    return logits.index_fill(-1, vision_tokens, -1e9)


def vision_parameters(model: torch.nn.Module) -> list[str]:
    """The names of the vision tower's parameters (the encoder and its merger into the language model)."""
    marker = f".{VISION_TOWER}."
    return [name for name, _ in model.named_parameters(remove_duplicate=False) if marker in f".{name}"]


def _rope_index_owner(model: torch.nn.Module) -> torch.nn.Module:
    for module in model.modules():
        if hasattr(type(module), "get_rope_index"):
            return module
    raise ValueError(f"{type(model).__name__} has no get_rope_index: not a Qwen-VL model")


def rope_positions(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   multi_modal: Sequence[dict | None] | None, prompt_width: int | None = None) -> torch.Tensor:
    """Each real token's mRoPE position ``[B, L, 3]`` (0 on padding), as the model computes them for
    ``input_ids`` ``[B, L]`` with ``attention_mask`` and the rows' image inputs (None: no images); the images'
    tokens are in the first ``prompt_width`` columns (default: all). A row without image inputs is text (an image
    token in it, which no image fills, is placed as text is)."""
    owner = _rope_index_owner(model)
    config = owner.config
    rows = [None] * len(input_ids) if multi_modal is None else list(multi_modal)
    grids = [row["image_grid_thw"] for row in rows if row is not None]
    types = (input_ids == config.image_token_id).int() + 2 * (input_ids == config.video_token_id).int()
    types[:, input_ids.shape[1] if prompt_width is None else prompt_width:] = 0
    types[torch.tensor([row is None for row in rows], dtype=torch.bool, device=types.device)] = 0
    positions, _ = owner.get_rope_index(input_ids, mm_token_type_ids=types,
                                        image_grid_thw=torch.cat(grids).to(input_ids.device) if grids else None,
                                        attention_mask=attention_mask)
    return positions.permute(1, 2, 0).masked_fill(~attention_mask.bool()[..., None], 0)


def model_positions(positions: torch.Tensor, text_positions: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, L, 3]`` positions as a Qwen-VL forward takes them, ``[3, B, L]``; with ``text_positions``
    ``[B, L]`` (packed rows: each sequence's token indices, which the model reads to keep the sequences of a
    row apart) ``[4, B, L]``, those first."""
    spatial = positions.permute(2, 0, 1)
    return spatial if text_positions is None else torch.cat([text_positions[None], spatial])


def image_inputs(multi_modal: Sequence[dict | None] | None, order: Sequence[int], device) -> dict[str, torch.Tensor]:
    """The image inputs of rows ``order`` (in the order their tokens appear in the forward's rows), joined:
    ``pixel_values`` and ``image_grid_thw``; ``{}`` when none of them has images."""
    rows = [multi_modal[i] for i in order if multi_modal is not None and multi_modal[i] is not None]
    if not rows:
        return {}
    return {"pixel_values": torch.cat([row["pixel_values"] for row in rows]).to(device),
            "image_grid_thw": torch.cat([row["image_grid_thw"] for row in rows]).to(device)}
