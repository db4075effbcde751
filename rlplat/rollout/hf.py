"""Hugging Face transformers rollout engine (the embedded default).

Holds its own unsharded copy of the policy on the worker's device and samples with ``generate``;
after each update the training engine's full weights are copied in (:meth:`load_weights`). The copy
costs one model's memory per device, fine for the small models this engine is meant for; vLLM and SGLang
are the engines for large models. Rollout log-probs are ``log_softmax(raw logits / temperature)`` of the
sampled token, the same quantity the training engine recomputes (top-p/top-k only restrict sampling).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from rlplat.protocol import Batch
from rlplat.rollout.base import (
    ROLLOUT_ENGINES,
    RolloutEngine,
    SamplingParams,
    assemble_rollout,
    response_mask_from_ids,
)
from rlplat.workers.engines.base import response_log_probs


@ROLLOUT_ENGINES.register("hf")
class HFRolloutEngine(RolloutEngine):
    def __init__(
        self,
        model_path: str,
        device: torch.device,
        eos_token_id: int,
        pad_token_id: int,
        dtype: torch.dtype = torch.float32,
        batch_size_seqs: int = 256,
        trust_remote_code: bool = False,
    ):
        from transformers import AutoModelForCausalLM

        self.device, self.eos_token_id, self.pad_token_id = device, eos_token_id, pad_token_id
        self.batch_size_seqs = batch_size_seqs
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, torch_dtype=dtype, trust_remote_code=trust_remote_code
        ).to(device)
        self.model.eval().requires_grad_(False)

    def _generation_config(self, params: SamplingParams):
        from transformers import GenerationConfig

        greedy = params.temperature == 0
        return GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else params.temperature,
            top_p=None if greedy else params.top_p,
            top_k=None if greedy or params.top_k <= 0 else params.top_k,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )

    @torch.no_grad()
    def _generate_chunk(self, prompts: Batch, params: SamplingParams) -> Batch:
        ids = prompts.tensors["prompts"].to(self.device)
        mask = prompts.tensors["prompt_mask"].to(self.device)
        out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=self._generation_config(params))
        generated = out.sequences[:, ids.shape[1] :]
        logits = torch.stack(out.logits, dim=1)  # [b, r, V], raw (before temperature / top-p)
        temperature = params.temperature if params.temperature > 0 else 1.0
        log_probs, _ = response_log_probs(logits, generated, temperature)
        pad = params.max_new_tokens - generated.shape[1]
        if pad:  # every sequence stopped early: pad to the fixed response length
            generated = torch.nn.functional.pad(generated, (0, pad), value=self.pad_token_id)
            log_probs = torch.nn.functional.pad(log_probs, (0, pad), value=0.0)
        response_mask = response_mask_from_ids(generated, self.eos_token_id)
        generated = generated.masked_fill(response_mask == 0, self.pad_token_id)
        return assemble_rollout(prompts, generated.cpu(), response_mask.cpu(), log_probs.float().cpu())

    def generate(self, batch: Batch, params: SamplingParams) -> Batch:
        chunks = [self._generate_chunk(chunk, params) for chunk in batch.split(self.batch_size_seqs)]
        return Batch.concat(chunks)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        state = self.model.state_dict()
        seen = set()
        for name, tensor in weights:
            if name not in state:
                raise KeyError(f"rollout model has no weight {name!r} (training and rollout models differ?)")
            state[name].copy_(tensor.to(state[name].device, state[name].dtype))
            seen.add(name)
        missing = set(state) - seen
        if missing:
            raise KeyError(f"weight sync left {len(missing)} rollout weights untouched, e.g. {sorted(missing)[:3]}")
