"""Checks of what a run needs from its surroundings, before any worker starts.

Each failure is a :class:`~rlplat.utils.errors.RunError` naming the key, the path and what was expected:
the output directory (a directory we can write), the model (a local Hugging Face directory with a
``config.json``, or a hub id that can be fetched), its chat template (``model.chat_template``), and the
packages of the chosen loggers.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from omegaconf import DictConfig

from rlplat.config.errors import ConfigError
from rlplat.config.plan import RunPlan
from rlplat.models.chat_template import resolve_chat_template
from rlplat.models.embedded import is_embedded
from rlplat.models.tokenizer import check_teacher_tokenizer
from rlplat.models.vision import is_vision
from rlplat.utils.errors import RunError
from rlplat.utils.tracking import missing_logger_package


def check_output_dir(path: str) -> None:
    """``trainer.output_dir`` must be (or become) a directory we can write to."""
    out = Path(path).expanduser()
    key = f"trainer.output_dir={path!r}"
    if out.exists() and not out.is_dir():
        raise RunError(f"{key} is a file, not a directory; choose another trainer.output_dir")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise RunError(f"{key} is under {existing}, which is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".rlplat-write-check"):
            pass
    except OSError as err:
        raise RunError(f"{key} is not writable ({err.strerror or err}); choose a directory you can write to") from None


def _looks_local(path: str) -> bool:
    """A path rather than a hub id (``org/name``): absolute, relative with ./ or ../, ~, or deeper."""
    return path.startswith(("/", "./", "../", "~", ".")) or path.count("/") > 1 or os.sep != "/" and os.sep in path


def check_model_path(path: str, key: str = "model.path"):
    """A local directory with ``config.json``, or a hub id whose config can be fetched (or is cached): then the
    config (None for a directory, which start-up read)."""
    local = Path(path).expanduser()
    if local.exists():
        if not local.is_dir():
            raise RunError(f"{key}={path!r} is a file; expected a Hugging Face model directory (with config.json) "
                           f"or a hub id")
        if not (local / "config.json").is_file():
            raise RunError(f"{key}={path!r} has no config.json; expected a Hugging Face model directory "
                           f"(save_pretrained output) or a hub id")
        return
    if _looks_local(path):
        raise RunError(f"{key}={path!r}: no such directory (resolved to {local.resolve()})")
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RunError(f"{key}={path!r} is not a local directory, and fetching it from the hub failed ({reason}); "
                       f"check the id and the network, or pass a local model directory") from None


def check_loggers(loggers) -> None:
    for name in loggers:
        if problem := missing_logger_package(name):
            raise RunError(problem)


def preflight(cfg: DictConfig, plan: RunPlan) -> None:
    check_output_dir(cfg.trainer.output_dir)
    check_loggers(cfg.trainer.logger)
    if not is_embedded(cfg.model.path) and (config := check_model_path(cfg.model.path)) is not None:
        if is_vision(config):  # a hub id's: plan again now that its config is known (what the engines refuse)
            from rlplat.workers.engine_setup import plan_run

            plan_run(cfg, plan.device)
    check_other_model_paths(cfg, plan)


def check_other_model_paths(cfg: DictConfig, plan: RunPlan) -> None:
    """The critic's, the reward model's and the judge's paths, each as ``model.path`` is checked (their workers
    would otherwise fail minutes later, with a hub message for a missing directory), and the tokenizer's."""
    paths = {"critic.model_path": cfg.critic.model_path if plan.needs_critic else None,
             "reward.model.path": cfg.reward.model.path, "reward.judge.model_path": cfg.reward.judge.model_path,
             "teacher.model_path": cfg.teacher.model_path if plan.needs_teacher else None}
    for key, path in paths.items():
        if path and not is_embedded(path):  # an embedded model (a judge's) is built when it is first needed
            check_model_path(path, key)
    if cfg.model.tokenizer_path:
        check_tokenizer_path(cfg.model.tokenizer_path)
    if cfg.model.chat_template:  # a name, a readable file or a template
        try:
            resolve_chat_template(cfg.model.chat_template)
        except ConfigError as e:
            raise RunError(str(e)) from None


def check_tokenizer_path(path: str, key: str = "model.tokenizer_path") -> None:
    """A local directory holding a tokenizer (``tokenizer_config.json`` or ``tokenizer.json``; no model config
    needed), or a hub id, checked as ``model.path`` is."""
    local = Path(path).expanduser()
    if not local.is_dir():
        check_model_path(path, key)  # a file, a missing directory or a hub id: model.path's answers
    elif not ((local / "tokenizer_config.json").is_file() or (local / "tokenizer.json").is_file()):
        raise RunError(f"{key}={path!r} has no tokenizer_config.json or tokenizer.json; expected a tokenizer's "
                       f"save_pretrained output or a hub id")


def checked_teacher(cfg: DictConfig, plan: RunPlan, tokenizer) -> str | None:
    """On-policy distillation's teacher directory (an embedded model's is built here when needed), once its
    tokenizer gives each of the student's tokens (``tokenizer``'s) the same id: the teacher scores the student's
    token ids as they are. None without a teacher."""
    if not plan.needs_teacher:
        return None
    path = cfg.teacher.model_path
    if is_embedded(path):
        from rlplat.trainer.sft import ensure_embedded_model

        path = str(ensure_embedded_model(path))
    check_teacher_tokenizer(tokenizer, path, f"teacher.model_path={cfg.teacher.model_path!r}",
                            cfg.model.trust_remote_code)
    return path

