"""The Megatron engine's checkpoints: torch.distributed.checkpoint directories of Hugging Face-named slices.

Each rank writes its Hugging Face pieces of the weights (``model``, as FSDP's checkpoint names them), of
AdamW's moments for the weights it steps (``optim``) and, with bf16 weights, of their fp32 master copies
(``optim.master``), each a slice of the whole tensor (:meth:`RankShards.checkpoint_pieces`), so a checkpoint
loads into any tensor / pipeline / data-parallel layout and exports like an FSDP one. AdamW's step count is
one number: every weight takes every step.
"""

from __future__ import annotations

import torch

from rlplat.engines.megatron.shards import RankShards
from rlplat.engines.optim import Optimizer

MOMENTS = ("exp_avg", "exp_avg_sq")


def stepped_here(model: torch.nn.Module, optim: Optimizer) -> dict[str, dict[str, torch.Tensor]]:
    """AdamW's state by Megatron name, of the weights this rank steps (AdamW's own dicts: a load writes into
    them)."""
    state = optim.local_state
    return {name: state[p] for name, p in model.named_parameters() if p in state}


def masters_here(model: torch.nn.Module, optim: Optimizer) -> dict[str, torch.Tensor]:
    """The fp32 master copies by Megatron name, of the bf16 weights this rank steps."""
    return {name: optim.masters[p] for name, p in model.named_parameters() if p in optim.masters}


def checkpoint_state(shards: RankShards, model: torch.nn.Module, optim: Optimizer | None, masters: bool = True,
                     weights_dtype: torch.dtype | None = None) -> dict:
    """This rank's part of the training state as torch.distributed.checkpoint stores it (module docstring);
    ``masters``: with the fp32 masters of bf16 weights; ``weights_dtype``: the weights as copies in that dtype
    (to load into)."""
    state = model.state_dict()
    weights = {name: state[name] if weights_dtype is None else state[name].to(weights_dtype) for name in shards.names}
    out = {"model": shards.checkpoint_pieces(weights)}
    if optim is not None:
        mine = stepped_here(model, optim)
        out["optim"] = {key: shards.checkpoint_pieces({name: s[key] for name, s in mine.items()}) for key in MOMENTS}
        if optim.masters and masters:
            out["optim"]["master"] = shards.checkpoint_pieces(masters_here(model, optim))
        out["optim"]["step"] = torch.tensor(float(max((s["step"] for s in mine.values()), default=0)))
    return out


def load_checkpoint_state(shards: RankShards, model: torch.nn.Module, optim: Optimizer | None, path: str) -> None:
    """Read this rank's slices from the checkpoint ``path``, whatever layout wrote it (and the moments of the
    weights it steps). bf16 weights take their fp32 masters from the checkpoint, or, from one written with
    fp32 weights, the weights themselves; fp32 weights read a bf16 run's bf16 weights."""
    import torch.distributed.checkpoint as dcp

    if optim is not None:  # moments to read into, for the weights this rank steps
        optim.start_state()
    has_masters = any(key.startswith("optim.master.")
                      for key in dcp.FileSystemReader(path).read_metadata().state_dict_metadata)
    target = checkpoint_state(shards, model, optim, masters=has_masters, weights_dtype=torch.float32)
    dcp.load(target, checkpoint_id=path)
    state = model.state_dict()
    with torch.no_grad():
        for name, tensor in shards.read_pieces(target["model"], shards.names).items():
            state[name].copy_(tensor)
    if optim is None:
        return
    mine = stepped_here(model, optim)
    for key in MOMENTS:
        for name, tensor in shards.read_pieces(target["optim"][key], list(mine)).items():
            mine[name][key] = tensor.to(shards.device).contiguous()
    for moments in mine.values():
        moments["step"] = target["optim"]["step"].to(shards.device, torch.float32).clone()
    if optim.masters:  # the masters, or from a checkpoint of fp32 weights, those weights (read as fp32)
        masters = masters_here(model, optim)
        source = target["optim"]["master"] if has_masters else target["model"]
        with torch.no_grad():
            for name, tensor in shards.read_pieces(source, list(masters)).items():
                masters[name].copy_(tensor)
