"""Rollout engines behind one ABC, chosen by ``rollout.name`` through ``ROLLOUT_ENGINES``.

Engines are registered lazily: an engine's module (and its package: vLLM, SGLang) is imported only
when a run chooses it, and a missing package is reported at start-up with the extra to install.
"""

from rlplat.rollout.base import ROLLOUT_ENGINES, ROLLOUT_SERVER_CLIENTS, RolloutEngine, RolloutSetup, SamplingParams

ROLLOUT_ENGINES.add_lazy("hf", "rlplat.rollout.hf:HFRolloutEngine", requires=("transformers",))
ROLLOUT_ENGINES.add_lazy("vllm", "rlplat.rollout.vllm:VLLMRolloutEngine", requires=("vllm",),
                         install="pip install -e '.[vllm]' (CPU machines: see docs/rollout.md)")
ROLLOUT_ENGINES.add_lazy("sglang", "rlplat.rollout.sglang:SGLangRolloutEngine", requires=("sglang",),
                         install="pip install -e '.[sglang]' (needs a CUDA machine)")
ROLLOUT_SERVER_CLIENTS.add_lazy("vllm", "rlplat.rollout.server:VLLMServerClient")

__all__ = ["ROLLOUT_ENGINES", "ROLLOUT_SERVER_CLIENTS", "RolloutEngine", "RolloutSetup", "SamplingParams"]
