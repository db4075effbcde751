"""Metrics sinks: the console and ``metrics.jsonl`` (one JSON object per step) in the output dir.

``trainer.logger`` picks the sinks; tensorboard and wandb are used only if their packages are installed
(a clear error says which package to install otherwise).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from rlplat.utils.errors import RunError

LOGGERS = ("console", "jsonl", "tensorboard", "wandb")  # the names trainer.logger accepts
CONSOLE_KEYS = (
    "score/mean", "response_length/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm",
    "val/accuracy", "timing/step_s",
)


def _short(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class Tracker:
    def __init__(self, loggers: list[str], output_dir: str | Path, config: dict[str, Any] | None = None,
                 project: str = "rlplat", run_name: str | None = None):
        self.loggers = list(loggers)
        unknown = [name for name in self.loggers if name not in LOGGERS]
        if unknown:
            raise RunError(f"trainer.logger: unknown logger(s) {', '.join(unknown)}; known: {', '.join(LOGGERS)}")
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = (self.output_dir / "metrics.jsonl").open("a") if "jsonl" in self.loggers else None
        self._tb = self._wandb = None
        if "tensorboard" in self.loggers:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise RunError("trainer.logger includes 'tensorboard', but it cannot be imported: pip install tensorboard") from err
            self._tb = SummaryWriter(str(self.output_dir / "tensorboard"))
        if "wandb" in self.loggers:
            try:
                import wandb
            except ImportError as err:
                raise RunError("trainer.logger includes 'wandb', but it cannot be imported: pip install wandb") from err
            self._wandb = wandb.init(project=project, name=run_name, config=config, dir=str(self.output_dir))

    def log(self, metrics: dict[str, float], step: int) -> None:
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        if "console" in self.loggers:
            shown = [f"{k}={_short(clean[k])}" for k in CONSOLE_KEYS if k in clean]
            print(f"[step {step}] " + " ".join(shown), flush=True)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(clean, step=step)

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
