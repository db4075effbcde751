"""``python -m rlplat.tools.export CHECKPOINT_DIR --out DIR [--dtype bfloat16] [--adapter]``: any checkpoint to a
Hugging Face model directory (safetensors, config, tokenizer) that ``AutoModelForCausalLM.from_pretrained`` loads.

A LoRA run's checkpoint (``model.lora.rank > 0``) holds the adapters only: the export merges them into the
run's base model (``W + alpha/r B A``), or with ``--adapter`` writes them as a PEFT adapter directory
(``PeftModel.from_pretrained(base_model, DIR)`` loads it).

A checkpoint (``<output_dir>/checkpoints/step_NNNNNN``) is checked against its manifest first. Its
``config.yaml`` (the run's resolved config; older checkpoints: the run directory's) says how the actor was
trained and from which model. FSDP and Megatron checkpoints alike are torch.distributed.checkpoint shards
under Hugging Face names, read here without a process group whatever world size and parallel layout wrote
them. The model's config and tokenizer come from the run's ``model.path`` (and ``model.tokenizer_path``).
Every failure is one line.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from rlplat.config.errors import ConfigError
from rlplat.config.imports import import_user_modules
from rlplat.engines.lora import ADAPTER, merge_adapters, peft_config, save_adapter_dir
from rlplat.models.embedded import is_embedded
from rlplat.models.hf_files import SHARD_BYTES, save_hf_model
from rlplat.trainer.checkpoint import MANIFEST, STEP_DIR, verify
from rlplat.trainer.preflight import check_model_path
from rlplat.trainer.run import resolve_model_path
from rlplat.utils.errors import RunError, debug_traceback
from rlplat.utils.files import plain_modes
from rlplat.utils.quiet import quiet_third_party

DTYPES = ("float32", "bfloat16", "float16")


class ExportError(ValueError):
    """The checkpoint or the destination cannot be used; the message says which and why."""


def check_checkpoint(ckpt: Path) -> None:
    """``ckpt`` is a complete, undamaged checkpoint; a run directory or its ``checkpoints/`` folder is
    answered with the newest checkpoint in it."""
    if not ckpt.is_dir():
        raise ExportError(f"{ckpt}: no such checkpoint directory (expected <output_dir>/checkpoints/step_NNNNNN)")
    if not (ckpt / MANIFEST).exists():
        folder = ckpt / "checkpoints" if (ckpt / "checkpoints").is_dir() else ckpt
        steps = {int(m.group(1)): p for p in folder.iterdir() if (m := STEP_DIR.fullmatch(p.name)) and p.is_dir()}
        if steps:
            raise ExportError(f"{ckpt} holds checkpoints but is not one; pass one of them, e.g. the newest: "
                              f"{steps[max(steps)]}")
    if problem := verify(ckpt):
        raise ExportError(f"{ckpt} is not a usable checkpoint: {problem}")


def check_out(out: Path, ckpt: Path) -> None:
    """``out`` is replaced by the model: refuse anything whose loss would hurt (a file, a directory holding
    something other than a model, the checkpoint's own run)."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file; give a directory to write the model into")
    if out.resolve() in ckpt.resolve().parents:
        raise ExportError(f"--out {out} contains the checkpoint {ckpt}; give a directory outside it")
    if out.is_dir() and any(out.iterdir()) and not (out / "config.json").is_file():
        raise ExportError(f"--out {out} is a non-empty directory without a model in it, and the export replaces "
                          f"it; give a new or empty directory")


def checkpoint_config(ckpt: Path) -> DictConfig:
    """The run config a checkpoint was written under."""
    for candidate in (ckpt / "config.yaml", ckpt.parent.parent / "config.yaml"):
        if candidate.is_file():
            cfg = OmegaConf.load(candidate)
            missing = [key for key in ("actor.strategy", "model.path") if OmegaConf.select(cfg, key) is None]
            if missing:
                raise ExportError(f"{candidate} has no {' or '.join(missing)}; it is not an rlplat run config")
            return cfg
    raise ExportError(f"{ckpt}: no config.yaml in the checkpoint or its run directory; cannot tell how it was "
                      f"trained")


def base_model(cfg: DictConfig) -> str:
    """The run's model directory (or hub id), whose config and tokenizer the export copies."""
    try:
        if not is_embedded(cfg.model.path):
            check_model_path(cfg.model.path)
        if cfg.model.get("tokenizer_path"):
            check_model_path(cfg.model.tokenizer_path, "model.tokenizer_path")
    except RunError as err:
        raise ExportError(f"the run's model is needed for its config and tokenizer, but {err}") from None
    return resolve_model_path(cfg)


def checkpoint_weights(actor_dir: Path) -> dict[str, torch.Tensor]:
    """The whole model of a torch.distributed.checkpoint directory (for a LoRA run: its adapters)."""
    return {name: tensor for bucket in checkpoint_buckets(actor_dir, bucket_bytes=None) for name, tensor in bucket}


def checkpoint_buckets(actor_dir: Path,
                       bucket_bytes: int | None = SHARD_BYTES) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The weights of a torch.distributed.checkpoint directory, whatever engine, world size and parallel layout
    wrote it, read a bucket of at most ``bucket_bytes`` at a time (a larger tensor alone; None: all at once),
    in the order they were written; the optimizer's entries are not read."""
    import torch.distributed.checkpoint as dcp

    if not (actor_dir / ".metadata").is_file():
        raise ExportError(f"{actor_dir}: no .metadata file, so not a torch.distributed.checkpoint directory")
    stored = dcp.FileSystemReader(str(actor_dir)).read_metadata().state_dict_metadata
    entries = [(key, meta) for key, meta in stored.items() if key.startswith("model.")]
    groups: list[list[str]] = [[]]
    size = 0
    for key, meta in entries:
        nbytes = meta.size.numel() * meta.properties.dtype.itemsize
        if groups[-1] and bucket_bytes is not None and size + nbytes > bucket_bytes:
            groups.append([])
            size = 0
        groups[-1].append(key)
        size += nbytes
    return (_read(actor_dir, keys) for keys in groups if keys)  # checked above, read as they are asked for


def _read(actor_dir: Path, keys: list[str]) -> list[tuple[str, torch.Tensor]]:
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is unavailable")
        read = _load_state_dict_from_keys(keys=set(keys), checkpoint_id=str(actor_dir))["model"]
    return [(key[len("model."):], read[key[len("model."):]]) for key in keys]


def check_engine(ckpt: Path, cfg: DictConfig) -> None:
    """The engine that wrote the checkpoint must declare that its checkpoints hold the model under Hugging Face
    names (``TrainingEngine.checkpoints_hf_names``; its package need not be installed here). An engine of one's
    own is looked up after the run's ``trainer.imports``."""
    from rlplat.engines import TRAINING_ENGINES

    try:
        import_user_modules(cfg.trainer.get("imports") or [])
    except ConfigError as err:
        raise ExportError(f"{ckpt}: {err}") from None
    strategy = cfg.actor.strategy

    def readable(name: str) -> bool:
        return TRAINING_ENGINES.get(name, require_installed=False).checkpoints_hf_names

    if strategy not in TRAINING_ENGINES or not readable(strategy):
        raise ExportError(f"{ckpt}: actor.strategy={strategy!r} has no exporter; known: "
                          f"{', '.join(name for name in TRAINING_ENGINES.names() if readable(name))}")


def export(ckpt: Path, out: Path, dtype: str = "float32", adapter: bool = False) -> Path:
    """Write the checkpoint's actor to ``out`` as a Hugging Face model (``adapter``: a LoRA run's adapters as a
    PEFT adapter directory); return ``out``."""
    check_checkpoint(ckpt)
    check_out(out, ckpt)
    cfg = checkpoint_config(ckpt)
    check_engine(ckpt, cfg)
    model_path = base_model(cfg)
    lora = OmegaConf.select(cfg, "model.lora")
    if lora is not None and lora.rank:
        adapters = checkpoint_weights(ckpt / "actor")
        if adapter:
            export_adapter(adapters, out, model_path, cfg.model)
            return out
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32,
                                                    trust_remote_code=cfg.model.trust_remote_code).state_dict()
        buckets = [list(merge_adapters(base, adapters, lora).items())]
    elif adapter:
        raise ExportError(f"{ckpt}: --adapter writes LoRA adapters, and this run trained every weight "
                          f"(model.lora.rank=0); export it without --adapter")
    else:  # a bucket at a time: the tool never holds the whole model
        buckets = checkpoint_buckets(ckpt / "actor")
    try:
        save_hf_model(buckets, out, model_path, cfg.model, getattr(torch, dtype))
    except ValueError as err:
        raise ExportError(f"{ckpt}: {err}") from None
    return out


def export_adapter(adapters: dict[str, torch.Tensor], out: Path, model_path: str, model_cfg: DictConfig) -> None:
    """Write a checkpoint's LoRA adapters as a PEFT adapter directory (adapter_config.json and
    adapter_model.safetensors: :func:`~rlplat.engines.lora.save_adapter_dir`), atomically, after peft has put
    them into the base model (so they fit it)."""
    import shutil
    import tempfile

    from peft import get_peft_model, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32,
                                                 trust_remote_code=model_cfg.trust_remote_code)
    model = get_peft_model(model, peft_config(model_cfg.lora), adapter_name=ADAPTER)
    # the checkpoint's names are those of the adapted model; peft's state dicts name the adapter implicitly
    state = {"base_model.model." + name.replace(f".{ADAPTER}.", "."): t for name, t in adapters.items()}
    result = set_peft_model_state_dict(model, state, adapter_name=ADAPTER)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        raise ExportError(f"the checkpoint's adapters do not fit the model: missing {missing[:2]}, unexpected "
                          f"{list(result.unexpected_keys)[:2]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".rlplat-adapter-", dir=out.parent))
    save_adapter_dir(adapters, model_cfg.lora, tmp, base_model=model_path)
    plain_modes(str(tmp))
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)


def _one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlplat.tools.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path,
                        help="a checkpoint directory, e.g. outputs/run/checkpoints/step_000100")
    parser.add_argument("--out", type=Path, required=True, help="directory to write the Hugging Face model into")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="dtype of the saved floating weights")
    parser.add_argument("--adapter", action="store_true",
                        help="a LoRA run: write its adapters as a PEFT adapter directory, not the merged model")
    args = parser.parse_args(argv)
    quiet_third_party(verbose=False)
    try:
        out = export(args.checkpoint, args.out, args.dtype, args.adapter)
    except (ExportError, OSError, RuntimeError, KeyError) as err:  # torch/transformers read errors too
        debug_traceback()
        print(f"rlplat: export: {_one_line(err)}", file=sys.stderr)
        return 2
    if args.adapter:
        print(f"rlplat: exported the LoRA adapters of {args.checkpoint} to {out}; load them with "
              f"PeftModel.from_pretrained(base_model, {str(out)!r})", flush=True)
        return 0
    print(f"rlplat: exported {args.checkpoint} to {out} ({args.dtype}); load it with "
          f"AutoModelForCausalLM.from_pretrained({str(out)!r})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
