"""``python -m rlplat.tools.export CHECKPOINT_DIR --out DIR [--dtype bfloat16]``: any checkpoint to a Hugging
Face model directory (safetensors, config, tokenizer) that ``AutoModelForCausalLM.from_pretrained`` loads.

A checkpoint (``<output_dir>/checkpoints/step_NNNNNN``) is checked against its manifest first. Its
``config.yaml`` (the run's resolved config; older checkpoints: the run directory's) says how the actor was
trained and from which model: FSDP checkpoints are torch.distributed.checkpoint shards of any world size,
read without a process group; Megatron checkpoints are one file per rank, whose tensor-parallel shards of
the first data-parallel replica are converted back to Hugging Face names. Every failure is one line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from rlplat.trainer.checkpoint import verify
from rlplat.trainer.run import resolve_model_path
from rlplat.utils.quiet import quiet_third_party
from rlplat.workers.roles import export_hf_model

DTYPES = ("float32", "bfloat16", "float16")


class ExportError(ValueError):
    """The checkpoint or the destination cannot be used; the message says which and why."""


def checkpoint_config(ckpt: Path) -> DictConfig:
    """The run config a checkpoint was written under."""
    for candidate in (ckpt / "config.yaml", ckpt.parent.parent / "config.yaml"):
        if candidate.is_file():
            return OmegaConf.load(candidate)
    raise ExportError(f"{ckpt}: no config.yaml in the checkpoint or its run directory; cannot tell how it was "
                      f"trained")


def fsdp_weights(actor_dir: Path) -> dict[str, torch.Tensor]:
    """The full model of a torch.distributed.checkpoint directory, whatever world size wrote it."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    return dict(_load_state_dict_from_keys(keys={"model"}, checkpoint_id=str(actor_dir))["model"])


def megatron_weights(actor_dir: Path, cfg: DictConfig, model_path: str) -> dict[str, torch.Tensor]:
    """Hugging Face weights from the first replica's tensor-parallel ranks (ranks 0..tp-1: Megatron puts the
    tensor-parallel group innermost)."""
    from transformers import AutoConfig

    from rlplat.engines.megatron.convert import GPTShape, megatron_to_hf

    tp = int(cfg.actor.megatron.tensor_model_parallel_size)
    files = [actor_dir / f"megatron_rank{rank}.pt" for rank in range(tp)]
    if missing := [f.name for f in files if not f.is_file()]:
        raise ExportError(f"{actor_dir}: missing {', '.join(missing)} for tensor_model_parallel_size={tp}")
    shards = [{name: t for name, t in torch.load(f, map_location="cpu", weights_only=False)["model"].items()
               if not name.endswith("_extra_state")} for f in files]
    hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=cfg.model.trust_remote_code)
    weights = megatron_to_hf(shards, GPTShape.from_hf_config(hf_config))
    if getattr(hf_config, "tie_word_embeddings", False):
        weights.setdefault("lm_head.weight", weights["model.embed_tokens.weight"])
    return weights


def export(ckpt: Path, out: Path, dtype: str = "float32") -> Path:
    """Write the checkpoint's actor to ``out`` as a Hugging Face model; return ``out``."""
    if not ckpt.is_dir():
        raise ExportError(f"{ckpt}: no such checkpoint directory (expected <output_dir>/checkpoints/step_NNNNNN)")
    if problem := verify(ckpt):
        raise ExportError(f"{ckpt} is not a usable checkpoint: {problem}")
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file; give a directory to write the model into")
    cfg = checkpoint_config(ckpt)
    model_path = resolve_model_path(cfg)
    strategy = cfg.actor.strategy
    if strategy == "fsdp":
        weights = fsdp_weights(ckpt / "actor")
    elif strategy == "megatron":
        weights = megatron_weights(ckpt / "actor", cfg, model_path)
    else:
        raise ExportError(f"{ckpt}: actor.strategy={strategy!r} has no exporter (fsdp, megatron)")
    export_hf_model(weights, str(out), model_path, cfg.model, getattr(torch, dtype))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlplat.tools.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a checkpoint directory, e.g. outputs/run/checkpoints/step_000100")
    parser.add_argument("--out", type=Path, required=True, help="directory to write the Hugging Face model into")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="dtype of the saved weights")
    args = parser.parse_args(argv)
    quiet_third_party(verbose=False)
    try:
        out = export(args.checkpoint, args.out, args.dtype)
    except (ExportError, OSError, RuntimeError, KeyError) as err:  # torch/transformers read errors too
        print(f"rlplat: export: {err}", file=sys.stderr)
        return 2
    print(f"rlplat: exported {args.checkpoint} to {out} ({args.dtype}); load it with "
          f"AutoModelForCausalLM.from_pretrained({str(out)!r})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
