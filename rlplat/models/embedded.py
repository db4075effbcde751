"""The embedded default model: a tiny Qwen2 built locally, warm-started by rlplat's own SFT, cached; and its
variants (a tool-using one, a mixture of experts).

``model.path=embedded`` (the default) resolves to :func:`embedded_model_dir`. This module says what the
model is: its architecture (:data:`SPEC`, built by :mod:`rlplat.models.tiny`) and its warm start
(:data:`WARM_START`: a short supervised phase on the built-in arithmetic task), which together with the
task generator's source name its cache directory under ``$RLPLAT_CACHE`` (default ``~/.cache/rlplat``).
Building and warm-starting it is the trainer's work (:func:`rlplat.trainer.sft.ensure_embedded_model`).
The warm start is deliberately short: it teaches the answer format and some arithmetic, and leaves most
of the accuracy for RL to win.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

from rlplat.data.synthetic import DEMONSTRATION_CALL, task_digest
from rlplat.models.tiny import CHAT_TEMPLATE, VISION_CHAT_TEMPLATE, TinyModelSpec, TinyMoESpec, TinyVisionSpec

EMBEDDED = "embedded"  # the model.path value that selects this model
SPEC = TinyModelSpec()
WARM_START = {"data": "builtin:arithmetic", "steps": 250, "batch_size": 64, "lr": 3e-3, "seed": 0}
# The tool variant (model.path=embedded-tools): the embedded model, fine-tuned further on tool_arithmetic
# prompts of which a share shows the calculator being used (rlplat.data.synthetic.with_tool_demonstrations)
# and the rest an immediate answer, so the agent loop has tool use for GRPO to reinforce.
EMBEDDED_TOOLS = "embedded-tools"
TOOL_WARM_START = {"rows": 8192, "demonstrations": 0.5, "steps": 500, "batch_size": 64, "lr": 3e-3, "seed": 0,
                   "max_response_length": 112}
# The mixture-of-experts variant (model.path=embedded-moe): a tiny Qwen3-MoE, warm-started like the embedded model
# from its own random initialisation, for twice the steps (its routers start uniform and learn to split the tokens:
# at 250 steps its answers' NLL is still 0.86 where the dense model's is 0.62). At two threads whatever the machine
# has: the thread count changes the last bits, and they decide which experts learn what, so each count builds another
# model (docs/moe.md: P(correct answer) 0.31 at two threads, 0.08 at one); two is the one the tests measured.
EMBEDDED_MOE = "embedded-moe"
MOE_SPEC = TinyMoESpec()
MOE_WARM_START = {**WARM_START, "steps": 500, "threads": 2}
# The vision-language variant (model.path=embedded-vl): a tiny Qwen2.5-VL (the embedded model's language model with
# a two-block vision encoder), warm-started from its random initialisation on the built-in visual task.
EMBEDDED_VL = "embedded-vl"
VISION_SPEC = TinyVisionSpec()
VISION_WARM_START = {"data": "builtin:shapes", "steps": 150, "batch_size": 64, "lr": 3e-3, "seed": 0}
# The teacher variant (teacher.model_path=embedded-teacher; docs/distillation.md): the embedded model fine-tuned further
# on the arithmetic task, a stronger model with its architecture and tokenizer for on-policy distillation to teach
# (greedy validation accuracy 0.96, the embedded model's 0.30).
EMBEDDED_TEACHER = "embedded-teacher"
TEACHER_WARM_START = {"data": "builtin:arithmetic", "steps": 500, "batch_size": 64, "lr": 1e-3, "seed": 1}
FURTHER = {EMBEDDED_TOOLS: TOOL_WARM_START, EMBEDDED_TEACHER: TEACHER_WARM_START}  # fine-tuned from the embedded model
VARIANTS = (EMBEDDED, EMBEDDED_TOOLS, EMBEDDED_MOE, EMBEDDED_VL, EMBEDDED_TEACHER)
TASK_OF = {EMBEDDED_VL: "shapes"}  # the built-in task a variant is warm-started on (default: arithmetic)


def is_embedded(model_path: str) -> bool:
    """Whether ``model.path`` names one of the embedded models rather than a directory or hub id."""
    return model_path in VARIANTS


def known_config(model_cfg):
    """The architecture of ``model.path`` when it is known without downloading: the embedded models' spec
    (:data:`SPEC` or :data:`MOE_SPEC`, no vocabulary size), a local directory's config, or a hub id's already in
    the Hugging Face cache (once :func:`rlplat.trainer.preflight.preflight` fetched it); else None (checked when it
    loads)."""
    if is_embedded(model_cfg.path):
        return spec_of(model_cfg.path)
    from transformers import AutoConfig

    local = os.path.isfile(os.path.join(model_cfg.path, "config.json"))
    try:
        return AutoConfig.from_pretrained(model_cfg.path, trust_remote_code=model_cfg.trust_remote_code,
                                          local_files_only=not local)
    except (OSError, ValueError):
        if local:
            raise
        return None


def spec_of(name: str) -> TinyModelSpec | TinyMoESpec | TinyVisionSpec:
    """The architecture of the embedded model ``name`` (one of :data:`VARIANTS`)."""
    return {EMBEDDED_MOE: MOE_SPEC, EMBEDDED_VL: VISION_SPEC}.get(name, SPEC)


def warm_start_of(name: str) -> dict:
    """The supervised warm start of the embedded model ``name`` from its random initialisation (the tool and
    teacher variants' further fine-tuning is :data:`FURTHER`'s)."""
    return {EMBEDDED_MOE: MOE_WARM_START, EMBEDDED_VL: VISION_WARM_START}.get(name, WARM_START)


def cache_root() -> Path:
    return Path(os.environ.get("RLPLAT_CACHE", Path.home() / ".cache" / "rlplat"))


def embedded_model_dir(name: str = EMBEDDED) -> Path:
    """The cache directory of the embedded model ``name`` (one of :data:`VARIANTS`)."""
    what = [asdict(spec_of(name)), warm_start_of(name), CHAT_TEMPLATE, task_digest(TASK_OF.get(name, "arithmetic"))]
    if name == EMBEDDED_VL:
        what.append(VISION_CHAT_TEMPLATE)
    if name == EMBEDDED_TOOLS:
        what += [TOOL_WARM_START, DEMONSTRATION_CALL, task_digest("tool_arithmetic")]
    elif name in FURTHER:
        what.append(FURTHER[name])
    key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / "models" / f"{name}-{key}"
