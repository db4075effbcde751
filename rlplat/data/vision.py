"""Images in prompts: reading them from rows, the prompt's image tokens, and the pixels a vision-language model sees.

Two row forms load (both as the datasets of the field write them):

* verl's: an ``images`` column holding a list of images, each ``{"bytes": ..., "path": ...}`` (how Hugging
  Face ``datasets`` stores an image in parquet), raw bytes or a file path, and a ``<image>`` placeholder in a
  message's text where each image goes, in order;
* TRL's: chat content parts (``{"type": "image"}`` and ``{"type": "text", "text": ...}``) with the images in
  an ``images`` (or ``image``) column.

Both become the same messages: each message's content a list of parts, an ``{"type": "image"}`` part where an
image goes, which the tokenizer's chat template renders (Qwen-VL's: ``<|vision_start|><|image_pad|>
<|vision_end|>``). :class:`ImageInputs` then does what the model's processor does (``Qwen2_5_VLProcessor``):
each image token of the rendered text becomes as many image tokens as the image has patches after merging
(``image_grid_thw.prod() // merge_size**2``), and the image processor gives the pixels (``pixel_values``
``[patches, C * T * P * P]``, ``image_grid_thw`` ``[images, 3]``). rlplat does this itself with the
tokenizer and ``AutoImageProcessor`` because transformers builds the Qwen-VL processors only with torchvision
installed (for their video processor), which CPU machines often lack; a test compares the two where
torchvision is present.

The prompt's ids are computed when the dataset is read (the images' sizes, read from their headers, give their
token counts); the pixels are decoded when a batch is assembled (:meth:`ImageInputs.inputs`, which names the
row of an image that does not decode), so the dataset holds the images' encoded bytes, not their pixels.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import Any

from rlplat.data.synthetic import DataError

IMAGE_PLACEHOLDER = "<image>"  # verl's marker of an image in a message's text
IMAGE_COLUMNS = ("images", "image")  # the columns a row's images may be in (TRL names both)
DEFAULT_IMAGE_TOKEN = "<|image_pad|>"  # Qwen-VL's; a tokenizer with an ``image_token`` attribute names its own
VISION_MARKERS = ("<|vision_start|>", "<|vision_end|>", "<|video_pad|>")  # Qwen-VL's other vision tokens
MULTI_MODAL = "multi_modal_inputs"  # the batch field of each row's image inputs (rlplat.protocol.FIELDS)


def shows_images(messages: list[dict]) -> bool:
    """Whether a prompt shows an image: an ``<image>`` placeholder or an image content part."""
    return any(IMAGE_PLACEHOLDER in m["content"] if isinstance(m["content"], str) else
               any(isinstance(p, dict) and p.get("type") == "image" for p in m["content"]) for m in messages)


def row_images(record: dict, where: str, shown: bool) -> list[Any] | None:
    """A row's images: the ``images`` column's value (``[]`` when it holds none), or the ``image`` column's when the
    prompt ``shown`` images (TRL's name; a text dataset's own ``image`` column is left alone); None for a row
    without such a column (a text row)."""
    present = [c for c in IMAGE_COLUMNS if c in record and (c == "images" or shown and record[c] is not None)]
    if len(present) > 1:
        raise DataError(f"{where}: has both an 'images' and an 'image' column; expected one")
    if not present:
        return None
    value = record[present[0]]
    if value is None:
        return []
    if hasattr(value, "tolist") and not isinstance(value, (bytes, str)):
        value = value.tolist()
    values = value if isinstance(value, list) else [value]
    for i, image in enumerate(values):
        if not isinstance(image, (bytes, str, dict)):
            raise DataError(f"{where}: {present[0]}[{i}] is a {type(image).__name__}; expected image bytes, a path "
                            f"or a {{'bytes': ..., 'path': ...}} dict")
    return values


def image_parts(messages: list[dict], where: str) -> tuple[list[dict], int]:
    """Messages whose content may be a string with ``<image>`` placeholders (verl) or a list of parts (TRL) ->
    ``(messages, images)``: each content a list of ``{"type": "text", "text"}`` / ``{"type": "image"}`` parts
    when the prompt shows an image (else the messages unchanged), and how many image parts there are."""
    out, count = [], 0
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            pieces = content.split(IMAGE_PLACEHOLDER)
            parts = [{"type": "text", "text": pieces[0]}] if pieces[0] else []
            for piece in pieces[1:]:
                parts += [{"type": "image"}] + ([{"type": "text", "text": piece}] if piece else [])
        else:
            parts = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    parts.append({"type": "text", "text": part["text"]})
                elif kind == "image":
                    parts.append({"type": "image"})
                else:
                    raise DataError(f"{where}: a {message['role']} message's content part {str(part)[:60]!r} is not "
                                    f"{{'type': 'text', 'text': str}} or {{'type': 'image'}}"
                                    + (" (videos are not supported)" if kind == "video" else ""))
        count += sum(part["type"] == "image" for part in parts)
        out.append({"role": message["role"], "content": parts})
    if count == 0:  # a text prompt keeps its string contents (and so its rendering)
        return [{"role": m["role"], "content": "".join(p["text"] for p in m["content"])} for m in out], 0
    return out, count


def text_of(content: Any) -> str:
    """A message's content as text: a string as it is, a list of parts with ``<image>`` where an image is (for
    what reads prompts as text: a text reward model, a judge, the logged samples)."""
    if not isinstance(content, list):
        return str(content)
    return "".join(IMAGE_PLACEHOLDER if part.get("type") == "image" else str(part.get("text", "")) for part in content)


def image_bytes(image: Any, where: str) -> bytes:
    """One image of a row (bytes, a path, or ``{"bytes", "path"}``) -> its encoded bytes."""
    if isinstance(image, dict):
        image = image.get("bytes") or image.get("path")
    if isinstance(image, str):
        if not os.path.isfile(image):
            raise DataError(f"{where}: image file {image!r} does not exist")
        with open(image, "rb") as file:
            return file.read()
    if not isinstance(image, bytes) or not image:
        raise DataError(f"{where}: an image has neither bytes nor a path")
    return image


def open_image(data: bytes, where: str, pixels: bool = True):
    """Decode an image's bytes as RGB (DataError naming ``where`` if they are not an image); without ``pixels``
    only its header is read (its size)."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
        return image.convert("RGB") if pixels else image
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:  # SyntaxError: PIL's broken PNG
        raise DataError(f"{where}: cannot decode an image ({err})") from None


class ImageInputs:
    """What a vision-language model's processor does to a prompt's images, from its tokenizer and image
    processor (see the module docstring). ``min_pixels`` / ``max_pixels``: the range the image processor
    resizes images into (None: the model's); with ``truncation="error"`` an image larger than ``max_pixels`` is
    an error rather than shrunk."""

    def __init__(self, image_processor, tokenizer, min_pixels: int | None = None, max_pixels: int | None = None,
                 truncation: str = "error"):
        self.image_processor, self.truncation = image_processor, truncation
        self.image_token = getattr(tokenizer, "image_token", None) or DEFAULT_IMAGE_TOKEN
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        if self.image_token_id is None or self.image_token_id == tokenizer.unk_token_id:
            raise ValueError(f"the tokenizer has no image token {self.image_token!r}")
        self.merge = image_processor.merge_size
        # the tokens that stand for images and videos in a prompt (Qwen-VL's names)
        vocab = tokenizer.get_vocab()
        self.vision_ids = {self.image_token_id} | {vocab[t] for t in VISION_MARKERS if t in vocab}
        size = dict(image_processor.size)
        if min_pixels is not None:
            size["shortest_edge"] = min_pixels
        if max_pixels is not None:
            size["longest_edge"] = max_pixels
        self.size = size
        self.max_pixels = size["longest_edge"]

    @classmethod
    def load(cls, path: str, tokenizer, data_cfg) -> ImageInputs:
        """The image inputs of the model ``path`` (a directory or hub id) with its image processor and the data
        settings ``data_cfg`` (``data.image_min_pixels``, ``data.image_max_pixels``, ``data.truncation``)."""
        from transformers import AutoImageProcessor

        return cls(AutoImageProcessor.from_pretrained(path), tokenizer, data_cfg.image_min_pixels,
                   data_cfg.image_max_pixels, data_cfg.truncation)

    def token_count(self, data: bytes, where: str) -> int:
        """The image tokens an image takes in the prompt (its patches after resizing, merged ``merge x merge``)."""
        width, height = open_image(data, where, pixels=False).size
        if self.truncation == "error" and height * width > self.max_pixels:
            raise DataError(f"{where}: an image of {width}x{height} = {width * height} pixels is over "
                            f"data.image_max_pixels={self.max_pixels}; set data.truncation=left|right|filter to "
                            f"shrink it, or a larger data.image_max_pixels")
        kwargs = {"min_pixels": self.size["shortest_edge"], "max_pixels": self.size["longest_edge"]}
        return self.image_processor.get_number_of_image_patches(height, width, kwargs) // self.merge**2

    def expand(self, text: str, counts: Sequence[int], where: str) -> str:
        """The rendered prompt ``text`` with its i-th image token repeated ``counts[i]`` times."""
        pieces = text.split(self.image_token)
        if len(pieces) - 1 != len(counts):
            raise DataError(f"{where}: the prompt shows {len(pieces) - 1} image(s) (placeholders) but the row has "
                            f"{len(counts)} image(s); expected one {IMAGE_PLACEHOLDER} (or image part) per image")
        return pieces[0] + "".join(self.image_token * n + piece for n, piece in zip(counts, pieces[1:]))

    def inputs(self, images: Sequence[bytes], where: str = "a prompt") -> dict:
        """The model's image inputs for one prompt's images (``where``: the row, named by an error):
        ``pixel_values`` and ``image_grid_thw``, and ``images``, the encoded images themselves (an inference
        engine that runs its own image processor, vLLM's, takes those)."""
        decoded = [open_image(data, where) for data in images]
        out = self.image_processor(images=decoded, size=self.size, return_tensors="pt")
        return {"pixel_values": out["pixel_values"].float(), "image_grid_thw": out["image_grid_thw"].long(),
                "images": list(images)}
