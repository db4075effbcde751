"""Checkpoints for exact resume, and the Hugging Face export of the actor.

Layout under ``trainer.output_dir``::

    checkpoints/step_000010/actor/      sharded model + optimizer (torch.distributed.checkpoint),
                                        extra_rank<r>.pt (LR schedule, RNG state of worker r)
    checkpoints/step_000010/critic/     the same for the critic (PPO)
    checkpoints/step_000010/trainer.json  step, sampler position, KL coefficient, uid counter
    checkpoints/latest                  name of the newest *complete* checkpoint (written last)
    hf_export/                          the newest actor as safetensors + tokenizer (from_pretrained-ready)

``trainer.resume_mode``: ``auto`` resumes from ``checkpoints/latest`` when present, ``disable`` never
resumes, anything else is a checkpoint directory to resume from. With several nodes, ``output_dir``
must be on a filesystem all nodes share.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

if TYPE_CHECKING:
    from rlplat.trainer.ppo import PPOTrainer


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Checkpointer:
    def __init__(self, cfg: DictConfig, model_path: str):
        self.cfg, self.model_path = cfg, model_path
        self.root = Path(cfg.trainer.output_dir) / "checkpoints"

    def save(self, trainer: PPOTrainer) -> Path:
        path = self.root / f"step_{trainer.step:06d}"
        path.mkdir(parents=True, exist_ok=True)
        c = trainer.c
        c.actor.save_checkpoint(str(path))
        if c.critic is not None:
            c.critic.save_checkpoint(str(path))
        state = {"step": trainer.step, "sampler": c.sampler.state_dict(), **trainer.state_dict()}
        _write_atomic(path / "trainer.json", json.dumps(state, indent=2))
        _write_atomic(self.root / "latest", path.name)
        c.actor.export_hf(str(Path(self.cfg.trainer.output_dir) / "hf_export"), self.model_path)
        print(f"[checkpoint] step {trainer.step} -> {path}", flush=True)
        return path

    def resume_path(self) -> Path | None:
        mode = self.cfg.trainer.resume_mode
        if mode == "disable":
            return None
        if mode == "auto":
            latest = self.root / "latest"
            return self.root / latest.read_text().strip() if latest.exists() else None
        path = Path(mode)
        if not (path / "trainer.json").exists():
            raise FileNotFoundError(
                f"trainer.resume_mode={mode!r}: {path} is not a checkpoint directory (no trainer.json); "
                f"use auto, disable, or a checkpoints/step_XXXXXX directory"
            )
        return path

    def maybe_resume(self, trainer: PPOTrainer) -> int:
        """Restore the newest checkpoint per ``trainer.resume_mode``; return the step to continue from."""
        path = self.resume_path()
        if path is None:
            return 0
        state = json.loads((path / "trainer.json").read_text())
        c = trainer.c
        c.actor.load_checkpoint(str(path))
        if c.critic is not None:
            c.critic.load_checkpoint(str(path))
        c.sampler.load_state_dict(state["sampler"])
        trainer.load_state_dict(state)
        print(f"[checkpoint] resumed from {path} at step {state['step']}", flush=True)
        return int(state["step"])
