"""Checkpoints for exact resume, and the Hugging Face export of the actor.

Layout under ``trainer.output_dir``::

    checkpoints/step_000010/actor/      sharded model + optimizer (torch.distributed.checkpoint),
                                        extra_rank<r>.pt (LR schedule, RNG state of worker r)
    checkpoints/step_000010/critic/     the same for the critic (PPO)
    checkpoints/step_000010/trainer.json  step, sampler position, KL coefficient, uid counter, initial val,
                                        prompt ledger (rlplat.trainer.ledger), prompts of batches in flight
    checkpoints/step_000010/manifest.json size and sha256 of every file above + the run-defining config
                                        (written last: a checkpoint without it is incomplete)
    checkpoints/latest                  name of the newest complete checkpoint (written after the manifest)
    hf_export/                          the final actor as safetensors + tokenizer (from_pretrained-ready),
                                        written at the end of the run (trainer.export_every_save: at every save)

A checkpoint is written into ``.step_000010.partial`` and renamed when complete, so a crash or a full disk
never leaves a half-written ``step_*`` or moves ``latest``. On resume every file is checked against the
manifest; a damaged newest checkpoint is reported and the previous good one is used. ``trainer.max_checkpoints``
keeps the newest N. ``trainer.resume_mode``: ``auto`` resumes from the newest good checkpoint, ``disable``
never resumes, anything else is a checkpoint directory. With several nodes, ``output_dir`` must be on a
filesystem all nodes share.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlplat.config.plan import RunPlan
from rlplat.models.hf_files import EXPORT_TEMP_PREFIX
from rlplat.trainer.components import Components
from rlplat.utils.errors import RunError
from rlplat.utils.tracking import flatten

STEP_DIR = re.compile(r"step_(\d+)")
MANIFEST = "manifest.json"
HF_EXPORT = "hf_export"
# Keys that change what a run means: resuming a checkpoint under different values is refused unless
# trainer.resume_allow_config_change=true. total_steps is here because it reshapes the LR schedule.
RUN_DEFINING = ("algorithm", "model.path", "data.train_files", "data.train_batch_size_prompts",
                "data.max_response_length", "rollout.n", "actor.mini_batch_size_prompts", "actor.ppo_epochs",
                "actor.optim", "critic.optim", "trainer.total_steps", "trainer.nnodes", "trainer.workers_per_node")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_defining(cfg: DictConfig, plan: RunPlan) -> dict:
    """The values of :data:`RUN_DEFINING` keys, flattened to ``{"key.path": value}``."""
    out = {}
    critic = plan.needs_critic
    constant = cfg.actor.optim.lr_schedule == "constant" and (not critic or cfg.critic.optim.lr_schedule == "constant")
    for key in RUN_DEFINING:
        if key == "trainer.total_steps" and constant:  # only a decaying schedule depends on it
            continue
        if key == "critic.optim" and not critic:
            continue
        value = OmegaConf.select(cfg, key)
        value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in flatten(value).items()})
        else:
            out[key] = value
    return out


def write_manifest(path: Path, config: dict) -> None:
    files = {str(f.relative_to(path)): {"size": f.stat().st_size, "sha256": _sha256(f)}
             for f in sorted(path.rglob("*")) if f.is_file() and f.name != MANIFEST}
    _write_atomic(path / MANIFEST, json.dumps({"files": files, "config": config}, indent=1))


def verify(path: Path) -> str | None:
    """None when ``path`` is a complete, undamaged checkpoint, else what is wrong with it."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
    except FileNotFoundError:
        return "no manifest.json (an incomplete or pre-manifest checkpoint)"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"manifest.json is unreadable ({err})"
    for name, meta in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != meta["size"]:
            return f"{name} has {f.stat().st_size} bytes, the manifest says {meta['size']}"
        if _sha256(f) != meta["sha256"]:
            return f"{name} does not match its checksum"
    try:
        json.loads((path / "trainer.json").read_text())
    except (OSError, ValueError) as err:
        return f"trainer.json is unreadable ({err})"
    return None


class Checkpointer:
    def __init__(self, cfg: DictConfig, plan: RunPlan):
        self.cfg, self.plan = cfg, plan
        self.root = Path(cfg.trainer.output_dir) / "checkpoints"

    def steps(self) -> list[Path]:
        """The ``step_*`` directories, newest first (anything else in the folder is ignored)."""
        if not self.root.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.root.iterdir() if (m := STEP_DIR.fullmatch(p.name)) and p.is_dir()]
        return [p for _, p in sorted(found, reverse=True)]

    # ---------------------------------------------------------------- save
    def save(self, step: int, c: Components, state: dict) -> Path:
        """Write the checkpoint of ``step``: the workers' engines, the prompt sampler and the trainer's own
        ``state``; on failure nothing changes and :class:`RunError` says so."""
        final = self.root / f"step_{step:06d}"
        partial = self.root / f".{final.name}.partial"
        try:
            self._write(c, {"step": step, "sampler": c.sampler.state_dict(), **state}, partial)
            if final.exists():  # the same step saved again (e.g. after a resume): replace it
                shutil.rmtree(final)
            os.replace(partial, final)
            _write_atomic(self.root / "latest", final.name)
        except Exception as err:  # a full disk, a worker failing to write: keep what was there
            shutil.rmtree(partial, ignore_errors=True)
            previous = self.newest()
            kept = f"the previous checkpoint {previous} and checkpoints/latest are intact" if previous \
                else "no earlier checkpoint exists"
            raise RunError(f"saving the checkpoint of step {step} to {final} failed "
                           f"({_reason(err)}); {kept}") from err
        self._prune()
        print(f"[checkpoint] step {step} -> {final}", flush=True)
        if self.cfg.trainer.export_every_save:
            self.export(step, c)
        return final

    def newest(self) -> Path | None:
        """The checkpoint ``checkpoints/latest`` names (None: nothing was saved)."""
        latest = self.root / "latest"
        return self.root / latest.read_text().strip() if latest.exists() else None

    def export(self, step: int, c: Components) -> Path:
        """Write the actor as a Hugging Face model to ``<output_dir>/hf_export`` (atomically: a temporary
        sibling directory renamed over it); a failure is a :class:`RunError` that says the checkpoint is safe."""
        path = Path(self.cfg.trainer.output_dir) / HF_EXPORT
        try:
            c.actor.export_hf(str(path), c.model_path)
        except Exception as err:
            kept = f"the checkpoint {newest} is intact; " if (newest := self.newest()) else ""
            raise RunError(f"exporting the model of step {step} to {path} failed ({_reason(err)}); {kept}"
                           f"python -m rlplat.tools.export turns a checkpoint into a model") from err
        return path

    def _write(self, c: Components, state: dict, path: Path) -> None:
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        for group in c.checkpointed():
            group.save_checkpoint(str(path))
        _write_atomic(path / "trainer.json", json.dumps(state, indent=2))
        (path / "config.yaml").write_text(OmegaConf.to_yaml(self.cfg, resolve=True))  # what export reads
        write_manifest(path, run_defining(self.cfg, self.plan))  # last: its presence means the rest is complete

    def _prune(self) -> None:
        keep = self.cfg.trainer.max_checkpoints
        if keep > 0:
            for old in self.steps()[keep:]:
                shutil.rmtree(old, ignore_errors=True)

    # ---------------------------------------------------------------- resume
    def resume_path(self) -> Path | None:
        """The checkpoint to resume from per ``trainer.resume_mode``, verified; None = start fresh."""
        mode = self.cfg.trainer.resume_mode
        if mode == "disable":
            return None
        if mode != "auto":
            path = Path(mode)
            problem = verify(path) if path.is_dir() else "no such directory"
            if problem:
                raise RunError(f"trainer.resume_mode={mode!r} is not a usable checkpoint: {problem}; use auto, "
                               f"disable, or a checkpoints/step_XXXXXX directory")
            return path
        candidates = self.steps()
        if (named := self.newest()) is not None and named not in candidates:
            print(f"[checkpoint] warning: checkpoints/latest names {named.name}, which does not exist; "
                  f"looking for the newest good checkpoint", flush=True)
        problems = []
        for path in candidates:
            problem = verify(path)
            if problem is None:
                if problems:
                    print(f"[checkpoint] warning: {'; '.join(problems)}; resuming from {path.name} instead",
                          flush=True)
                return path
            problems.append(f"{path.name} is unusable: {problem}")
        if problems:
            raise RunError(f"no usable checkpoint in {self.root}: {'; '.join(problems)}; move them away or set "
                           f"trainer.resume_mode=disable to start from scratch")
        return None

    def check_config(self, path: Path) -> None:
        """Refuse to resume a checkpoint written under different run-defining keys (unless allowed)."""
        saved = json.loads((path / MANIFEST).read_text()).get("config", {})
        now = run_defining(self.cfg, self.plan)
        diffs = [f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(saved) | set(now))
                 if saved.get(k) != now.get(k)]
        if not diffs:
            return
        if self.cfg.trainer.resume_allow_config_change:
            print(f"[checkpoint] warning: resuming {path} with a changed config: {'; '.join(diffs)}", flush=True)
            return
        raise RunError(f"{path} was written with a different config ({'; '.join(diffs)}); resume with the same "
                       f"settings, set trainer.resume_allow_config_change=true to continue anyway, or use another "
                       f"trainer.output_dir (or trainer.resume_mode=disable) to start a new run")

    def maybe_resume(self, c: Components) -> dict | None:
        """Restore the workers and the sampler from the newest good checkpoint per ``trainer.resume_mode``;
        return its ``trainer.json`` state (``step`` and the trainer's own state), or None to start fresh."""
        path = self.resume_path()
        if path is None:
            return None
        self.check_config(path)
        state = json.loads((path / "trainer.json").read_text())
        for group in c.checkpointed():
            group.load_checkpoint(str(path))
        c.sampler.load_state_dict(state["sampler"])
        print(f"[checkpoint] resumed from {path} at step {state['step']}", flush=True)
        return state


def _reason(err: BaseException) -> str:
    """The innermost cause's one-line message (Ray wraps worker exceptions)."""
    while err.__cause__ is not None:
        err = err.__cause__
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1] if text else ''}".rstrip(": ")


def remove_stale_exports(output_dir: str | Path) -> list[Path]:
    """Delete the temporary export directories a killed run left in ``output_dir`` (an export writes to
    ``.hf_export-*`` and renames it to ``hf_export`` when complete); returns what was removed."""
    stale = sorted(Path(output_dir).glob(f"{EXPORT_TEMP_PREFIX}*"))
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale
