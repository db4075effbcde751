"""Hugging Face transformers rollout engine (the embedded default).

Holds its own unsharded copy of the policy on the worker's device and samples with ``generate``;
after each update the training engine's full weights are copied in (:meth:`load_weights`). The copy
costs one model's memory per device, fine for the small models this engine is meant for; vLLM and SGLang
are the engines for large models. Rollout log-probs are ``log_softmax(raw logits / temperature)`` of the
sampled token, the same quantity the training engine recomputes (top-p/top-k only restrict sampling).

Sampling is fully specified by rlplat's config: every field of the generation config that changes the
distribution is passed explicitly, and the model directory's ``generation_config.json`` (which may set
top-k, repetition penalties, ...) is ignored unless ``rollout.hf.use_model_generation_config=true``.
Otherwise transformers would fill unset fields from it (and default top-k to 50), and rollouts would be
sampled from a different distribution than the one the trainer's log-probs describe.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable

import torch

from rlplat.protocol import Batch
from rlplat.rollout.base import RolloutEngine, RolloutSetup, SamplingParams, WeightBucket, assemble_rollout
from rlplat.sequence import response_log_probs, response_mask_from_ids


class HFRolloutEngine(RolloutEngine):
    def __init__(self, setup: RolloutSetup, engine_cfg):
        from transformers import AutoModelForCausalLM, GenerationConfig

        self.setup = setup
        self.device, self.eos_token_id, self.pad_token_id = setup.device, setup.eos_token_id, setup.pad_token_id
        self.batch_size_seqs = engine_cfg.batch_size_seqs_per_worker
        self.model = AutoModelForCausalLM.from_pretrained(
            setup.model_path, dtype=setup.dtype, trust_remote_code=setup.trust_remote_code
        ).to(setup.device)
        self.model.eval().requires_grad_(False)
        self.use_model_generation_config = engine_cfg.use_model_generation_config
        if not self.use_model_generation_config:
            # generate() fills every unset field from this object: make it carry no sampling opinions.
            self.model.generation_config = GenerationConfig(eos_token_id=self.eos_token_id,
                                                            pad_token_id=self.pad_token_id)

    def _generation_config(self, params: SamplingParams):
        from transformers import GenerationConfig

        greedy = params.temperature == 0
        if self.use_model_generation_config:
            # The model's file is the base; rlplat's temperature, and top-p/top-k where set, override it.
            config = copy.deepcopy(self.model.generation_config)
            config.update(do_sample=not greedy, temperature=params.temperature or 1.0,
                          max_new_tokens=params.max_new_tokens, eos_token_id=self._stop_ids(params) or None,
                          pad_token_id=self.pad_token_id, output_logits=True, return_dict_in_generate=True)
            if params.top_p < 1:
                config.top_p = params.top_p
            if params.top_k > 0:
                config.top_k = params.top_k
            return config
        return GenerationConfig(
            do_sample=not greedy,
            temperature=1.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=0 if greedy or params.top_k <= 0 else params.top_k,  # 0 disables top-k (None means 50)
            typical_p=1.0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            min_new_tokens=0,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=self._stop_ids(params) or None,
            pad_token_id=self.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )

    def _stop_ids(self, params: SamplingParams) -> list[int]:
        return [*([] if params.ignore_eos else [self.eos_token_id]), *params.stop_token_ids]

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
        response_mask = response_mask_from_ids(generated, tuple(self._stop_ids(params)))
        generated = generated.masked_fill(response_mask == 0, self.pad_token_id)
        return assemble_rollout(prompts, generated.cpu(), response_mask.cpu(), log_probs.float().cpu())

    def generate(self, batch: Batch, params: SamplingParams) -> Batch:
        with self._random_stream(params.seed):
            return Batch.concat([self._generate_chunk(chunk, params) for chunk in batch.split(self.batch_size_seqs)])

    @contextlib.contextmanager
    def _random_stream(self, seed: int | None):
        if seed is None:
            yield
            return
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(seed)
            yield

    @torch.no_grad()
    def load_weights(self, buckets: Iterable[WeightBucket]) -> None:
        state = self.model.state_dict()
        seen = set()
        for bucket in buckets:
            for name, tensor in bucket:
                if name not in state:
                    raise KeyError(f"rollout model has no weight {name!r} (training and rollout models differ?)")
                state[name].copy_(tensor.to(state[name].device, state[name].dtype))
                seen.add(name)
        missing = set(state) - seen
        if missing:
            raise KeyError(f"weight sync left {len(missing)} rollout weights untouched, e.g. {sorted(missing)[:3]}")
