"""Methods rlplat adds to vLLM's workers (``LLM(worker_extension_cls=...)``), called by ``collective_rpc``.

A weight update is ``rlplat_start_weight_update`` → ``rlplat_load_weights`` per bucket →
``rlplat_finish_weight_update``. Where vLLM has its layer-wise reload (``model_loader.reload``, 0.2x
and later), start and finish wrap the loads in it: vLLM repacks weights after loading (e.g. into the
CPU backend's kernel layout, or quantised formats), and a plain second ``load_weights`` into repacked
parameters fails; the reload path buffers each layer's checkpoint-format tensors and re-runs that
processing. Older vLLM versions load directly.

This module is imported inside vLLM's worker, so it imports vLLM lazily and nothing from rlplat.
"""

from __future__ import annotations


def _reload_functions():
    try:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload
    except ImportError:
        return None
    return initialize_layerwise_reload, finalize_layerwise_reload


def _repack_experts_on_reload(model) -> list:
    """vLLM 0.32's CPU MoE backend packs a layer's experts into its kernel's layout once, when the model is loaded
    (its experts' ``process_weights_after_loading``); the layer-wise reload re-runs the layer's own processing but
    not that step, and copies the unpacked weights into the packed storage (sampling from scrambled experts:
    docs/moe.md). Wrap each such layer's processing, for this update, to pack the new weights before they are
    copied. On CPU only: vLLM's comments call that step a no-op for most GPU kernels, and no GPU with vLLM has
    tested it. Returns the wrapped methods (the wrapper is an attribute of each: deleting it restores the class's)."""
    from vllm.platforms import current_platform

    wrapped = []
    if not current_platform.is_cpu():
        return wrapped
    for layer in model.modules():
        method = getattr(layer, "quant_method", None)
        experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
        if experts is None or "process_weights_after_loading" in vars(method):  # not MoE, or wrapped (shared)
            continue

        def process(layer, experts=experts, original=method.process_weights_after_loading):
            original(layer)
            experts.process_weights_after_loading(layer)

        method.process_weights_after_loading = process
        wrapped.append(method)
    return wrapped


class RLPlatWeightReceiver:
    """Mixed into vLLM's GPU/CPU worker class; ``self.model_runner`` and ``self.vllm_config`` are the worker's."""

    def rlplat_start_weight_update(self) -> None:
        functions = _reload_functions()
        if functions is not None:
            from vllm.config import set_current_vllm_config

            with set_current_vllm_config(self.vllm_config):
                functions[0](self.model_runner.get_model())
            self._rlplat_wrapped = _repack_experts_on_reload(self.model_runner.get_model())

    def rlplat_load_weights(self, bucket: list) -> int:
        """Load one bucket of (Hugging Face name, full tensor) pairs through the model's own
        ``load_weights``, which fuses q/k/v and gate/up and shards for tensor parallelism."""
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.vllm_config):
            self.model_runner.get_model().load_weights(weights=iter(bucket))
        return len(bucket)

    def rlplat_load_serialized_weights(self, payload: str) -> int:
        """A bucket sent over HTTP (server mode): base64 text of a safetensors file."""
        import base64

        from safetensors.torch import load

        return self.rlplat_load_weights(list(load(base64.b64decode(payload)).items()))

    def rlplat_finish_weight_update(self) -> None:
        functions = _reload_functions()
        if functions is not None:
            from vllm.config import set_current_vllm_config

            with set_current_vllm_config(self.vllm_config):
                functions[1](self.model_runner.get_model(), self.vllm_config.model_config)
            for method in getattr(self, "_rlplat_wrapped", ()):
                del method.process_weights_after_loading
            self._rlplat_wrapped = []
