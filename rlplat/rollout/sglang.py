"""SGLang rollout engine (``rollout=sglang``): SGLang's offline ``Engine`` inside each colocated worker.

Written against SGLang's documented offline-engine API: ``Engine.generate(input_ids=..., sampling_params=...,
return_logprob=True)`` (``meta_info["output_token_logprobs"]`` holds ``(logprob, token_id, text)``
per generated token, computed after temperature scaling), ``update_weights_from_tensor`` for weight
buckets, ``flush_cache`` after an update, and ``release_memory_occupation`` /
``resume_memory_occupation`` (with ``tags``) for sleep and wake-up. SGLang has CUDA kernels only: this
engine runs on GPU machines, and its tests skip where ``sglang`` does not import.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from rlplat.config.errors import ConfigError
from rlplat.config.plan import RolloutDeclaration
from rlplat.models.moe import checkpoint_layout
from rlplat.protocol import Batch
from rlplat.rollout.base import (
    RolloutEngine, RolloutSetup, SamplingParams, WeightBucket, assemble_rollout, check_fraction,
    check_load_format, pad_responses, prompt_token_lists, reservation,
)


class SGLangRolloutEngine(RolloutEngine):
    @classmethod
    def check_config(cls, engine_cfg, key: str, device: str) -> None:
        check_load_format(engine_cfg, key)
        check_fraction(engine_cfg, key, "mem_fraction_static")
        if device != "cuda":
            raise ConfigError("rollout.name=sglang needs a CUDA device (SGLang has no CPU kernels); use vllm or hf")

    @classmethod
    def declare(cls, engine_cfg, device: str) -> RolloutDeclaration:
        """SGLang releases its memory between rollouts with ``rollout.sglang.sleep``."""
        return replace(super().declare(engine_cfg, device), sleeps=bool(engine_cfg.sleep))

    @classmethod
    def memory(cls, shape, engine_cfg, key, dtype, device, sequences, length, device_memory, lent_weights):
        """SGLang reserves ``mem_fraction_static`` of a GPU's memory (:func:`~rlplat.rollout.base.reservation`)."""
        return reservation(shape, engine_cfg, key, "mem_fraction_static", dtype, device, device_memory)

    def __init__(self, setup: RolloutSetup, engine_cfg):
        import sglang

        if setup.device.type != "cuda":
            raise RuntimeError("rollout=sglang needs a CUDA device (SGLang has no CPU kernels); use rollout=vllm or hf")
        self.setup, self.cfg = setup, engine_cfg
        self.needs_initial_weights = engine_cfg.load_format == "dummy"
        self.engine = sglang.Engine(
            # rollout.sglang.*
            tp_size=engine_cfg.tensor_parallel_size,
            mem_fraction_static=engine_cfg.mem_fraction_static,
            load_format=engine_cfg.load_format,
            enable_memory_saver=engine_cfg.sleep,
            context_length=engine_cfg.max_model_len or setup.max_model_len,
            # the run's model and device
            model_path=setup.model_path,
            tokenizer_path=setup.tokenizer_path,
            dtype=setup.dtype_name,
            trust_remote_code=setup.trust_remote_code,
            random_seed=setup.seed + setup.rank,
            base_gpu_id=setup.device.index or 0,
            skip_tokenizer_init=True,  # rlplat sends and receives token ids
            log_level="error",
        )
        self._asleep = False

    def generate(self, batch: Batch, params: SamplingParams) -> Batch:
        greedy = params.temperature == 0
        sampling = {
            "temperature": params.temperature,
            "top_p": 1.0 if greedy else params.top_p,
            "top_k": -1 if greedy or params.top_k <= 0 else params.top_k,
            "max_new_tokens": params.max_new_tokens,
            "stop_token_ids": params.stop_ids(self.setup.eos_token_id),
            "ignore_eos": params.ignore_eos,
        }
        prompts = prompt_token_lists(batch)
        per_row = [dict(sampling) for _ in prompts]
        if params.seed is not None:
            for i, row in enumerate(per_row):
                row["sampling_seed"] = params.seed + i
        outputs = self.engine.generate(input_ids=prompts, sampling_params=per_row, return_logprob=True)
        token_ids = [list(out["output_ids"]) for out in outputs]
        log_probs = [[entry[0] for entry in out["meta_info"]["output_token_logprobs"]] for out in outputs]
        responses, mask, lps = pad_responses(token_ids, log_probs, params.max_new_tokens, self.setup.pad_token_id)
        return assemble_rollout(batch, responses, mask, lps)

    def load_weights(self, buckets: Iterable[WeightBucket]) -> None:
        for bucket in buckets:  # a mixture of experts' fused expert tensors as the checkpoint's per-expert ones
            self.engine.update_weights_from_tensor(named_tensors=checkpoint_layout(bucket), flush_cache=False)
        self.engine.flush_cache()

    def sleep(self) -> None:
        if self.cfg.sleep and not self._asleep:
            self.engine.release_memory_occupation(tags=["kv_cache", "weights"])
            self._asleep = True

    def wake_up(self, tags: tuple[str, ...] = ("weights", "kv_cache")) -> None:
        if self.cfg.sleep and self._asleep:
            self.engine.resume_memory_occupation(tags=list(tags))
            self._asleep = "kv_cache" not in tags

    @property
    def weights_discarded_by_sleep(self) -> bool:
        return self._asleep  # released weights come back uninitialised
