"""Methods rlplat adds to vLLM's workers (``LLM(worker_extension_cls=...)``), called by ``collective_rpc``.

This module is imported inside vLLM's worker, so it imports nothing from vLLM or rlplat at module level.
"""

from __future__ import annotations


class RLPlatWeightReceiver:
    """Mixed into vLLM's GPU/CPU worker class; ``self.model_runner`` is the worker's."""

    def rlplat_load_weights(self, bucket: list) -> int:
        """Load one bucket of (Hugging Face name, full tensor) pairs through the model's own
        ``load_weights``, which fuses q/k/v and gate/up and shards for tensor parallelism."""
        self.model_runner.model.load_weights(weights=iter(bucket))
        return len(bucket)

    def rlplat_named_weights(self) -> dict:
        """The worker's weights under vLLM's names (CPU copies), for tests and debugging."""
        return {name: p.detach().cpu().clone() for name, p in self.model_runner.model.named_parameters()}
