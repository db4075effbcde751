"""Writing a Hugging Face model directory from weights that arrive a bucket at a time.

:func:`save_hf_model` takes the weights as an engine's ``export_weights`` (or the export tool's checkpoint
reader) yields them and writes each safetensors file as soon as it is full, so the writer holds one file's
tensors at most, never the whole model (a 7B model's export needs no 28 GB of host memory). The files
follow Hugging Face's layout (``model.safetensors``, or ``model-0000k-of-0000N.safetensors`` with
``model.safetensors.index.json``), beside the model's config, generation config and tokenizer, so
``AutoModelForCausalLM.from_pretrained`` loads the directory. Every name and shape is checked against the
architecture (built on the meta device: no memory), and the directory appears whole or not at all.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import torch
from omegaconf import DictConfig

EXPORT_TEMP_PREFIX = ".hf_export-"  # an export is written to such a sibling directory, then renamed
SHARD_BYTES = 2 * 2**30  # the most bytes of weights in one safetensors file


def save_hf_model(buckets: Iterable[list[tuple[str, torch.Tensor]]], path: str | os.PathLike, model_path: str,
                  model_cfg: DictConfig, dtype: torch.dtype = torch.float32, shard_bytes: int = SHARD_BYTES) -> None:
    """Write the weights in ``buckets`` (Hugging Face names, every weight of ``model_path``'s architecture once),
    cast to ``dtype``, with ``model_path``'s config and tokenizer as a Hugging Face model directory at ``path``:
    into a sibling temporary directory, renamed over ``path`` when complete (removed on any error). A tied
    output layer is not written (the model ties it to the embedding, as ``save_pretrained`` leaves it out)."""
    from transformers import AutoConfig

    from rlplat.models.tokenizer import load_tokenizer

    from rlplat.models.vision import is_vision
    from rlplat.utils.files import plain_modes

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=model_cfg.trust_remote_code)
    shapes, tied = _architecture(config, model_cfg.trust_remote_code)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=EXPORT_TEMP_PREFIX, dir=path.parent))
    try:
        written = _write_shards(buckets, tmp, shapes, tied, dtype, shard_bytes)
        if missing := sorted(set(shapes) - set(tied) - written):
            raise ValueError(f"the weights given for {model_path} lack {len(missing)} tensors, e.g. {missing[:3]}")
        config.dtype = dtype
        config.save_pretrained(tmp)
        _generation_config(model_path, config).save_pretrained(tmp)
        load_tokenizer(model_cfg, model_path).save_pretrained(tmp)
        if is_vision(config):  # a vision-language model's image processor
            from transformers import AutoImageProcessor

            AutoImageProcessor.from_pretrained(model_path).save_pretrained(tmp)
        plain_modes(tmp)  # mkdtemp's directory is private; an export is for colleagues too
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _architecture(config, trust_remote_code: bool) -> tuple[dict[str, torch.Size], set[str]]:
    """Every weight's shape in the model built from ``config`` (on the meta device), and the names of those
    tied to another weight (left out of the files)."""
    from rlplat.models.vision import auto_model_class

    with torch.device("meta"):
        model = auto_model_class(config).from_config(config, trust_remote_code=trust_remote_code)
    first_name: dict[int, str] = {}
    tied = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in first_name:
            tied.add(name)
        first_name.setdefault(id(tensor), name)
    return {name: tensor.shape for name, tensor in model.state_dict().items()}, tied


def _write_shards(buckets, folder: Path, shapes: dict[str, torch.Size], tied: set[str], dtype: torch.dtype,
                  shard_bytes: int) -> set[str]:
    """Write the weights into safetensors files of at most ``shard_bytes`` (a larger tensor gets a file of its
    own) in ``folder``, named and indexed as ``save_pretrained`` names them; return the names written."""
    from safetensors.torch import save_file

    files: list[dict[str, str]] = []  # per file, the names it holds
    shard: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        save_file(shard, str(folder / f"part-{len(files):05d}.safetensors"), metadata={"format": "pt"})
        files.append(dict.fromkeys(shard))
        shard.clear()

    for bucket in buckets:
        for name, tensor in bucket:
            if name not in shapes:
                raise ValueError(f"the weights given hold {name!r}, which the model's architecture has no place for")
            if tuple(tensor.shape) != tuple(shapes[name]):
                raise ValueError(f"the weight {name!r} has shape {tuple(tensor.shape)}; the model's architecture "
                                 f"expects {tuple(shapes[name])}")
            if name in tied:
                continue  # the model ties it to another weight (an engine lists a tied output layer too)
            if name in shard or any(name in held for held in files):
                raise ValueError(f"the weight {name!r} is given twice")
            tensor = tensor.detach().to("cpu", dtype).contiguous()
            nbytes = tensor.numel() * tensor.element_size()
            if shard and size + nbytes > shard_bytes:
                flush()
                size = 0
            shard[name] = tensor
            size += nbytes
            total += nbytes
    if shard or not files:
        flush()
    count = len(files)
    names = ["model.safetensors"] if count == 1 else \
        [f"model-{k + 1:05d}-of-{count:05d}.safetensors" for k in range(count)]
    for index, name in enumerate(names):
        os.replace(folder / f"part-{index:05d}.safetensors", folder / name)
    if count > 1:
        weight_map = {tensor: name for name, held in zip(names, files) for tensor in held}
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    return {name for held in files for name in held}


def _generation_config(model_path: str, config):
    """The model's generation config (its ``generation_config.json``, or the one its config implies), as
    ``save_pretrained`` writes it."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model_path)
    except OSError:
        return GenerationConfig.from_model_config(config)
