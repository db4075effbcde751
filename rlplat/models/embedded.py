"""The embedded default model: a tiny Qwen2 built locally and warm-started by rlplat's own SFT.

``model.path=embedded`` (the default) resolves here. The first call builds the model and tokenizer
(:mod:`rlplat.models.tiny`), runs a short supervised phase on the built-in arithmetic task
(:mod:`rlplat.trainer.sft`) and caches the result under ``$RLPLAT_CACHE`` (default ``~/.cache/rlplat``);
later calls reuse it. The warm start is deliberately short: it teaches the answer format and some
arithmetic, and leaves most of the accuracy for RL to win.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from rlplat.models.tiny import TinyModelSpec, build_tiny_model

SPEC = TinyModelSpec()
WARM_START = {"data": "builtin:arithmetic", "steps": 250, "batch_size": 64, "lr": 3e-3, "seed": 0}


def cache_root() -> Path:
    return Path(os.environ.get("RLPLAT_CACHE", Path.home() / ".cache" / "rlplat"))


def embedded_model_dir() -> Path:
    key = hashlib.sha256(json.dumps([asdict(SPEC), WARM_START], sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / "models" / f"embedded-{key}"


def ensure_embedded_model() -> Path:
    """Return the warm-started embedded model's directory, building it on first use."""
    from rlplat.trainer.sft import run_sft

    target = embedded_model_dir()
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"[embedded] building the tiny model and warm-starting it with SFT ({WARM_START['steps']} steps) "
          f"-> {target}", flush=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        base = build_tiny_model(Path(tmp) / "init", SPEC, seed=WARM_START["seed"])
        out = Path(tmp) / "sft"
        run_sft(str(base), [WARM_START["data"]], str(out), WARM_START["steps"], WARM_START["batch_size"],
                WARM_START["lr"], micro_batch_size=WARM_START["batch_size"], seed=WARM_START["seed"])
        if target.exists():  # another process finished first
            return target
        shutil.move(str(out), str(target))
    return target
