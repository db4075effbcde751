"""The rollout-engine interface: prompts in, sampled responses (with their log-probs) out.

Input Batch fields: ``prompts`` ``[B, P]`` (left-padded ids) and ``prompt_mask`` ``[B, P]``. Output adds
``responses`` ``[B, R]`` (right-padded with the pad id), ``response_mask`` ``[B, R]`` (1 up to and
including the EOS token), ``rollout_log_probs`` ``[B, R]`` (log-softmax of logits / temperature),
and the concatenated ``input_ids``, ``attention_mask`` and ``position_ids`` ``[B, P + R]`` that the
training engines consume. ``R`` is always ``max_new_tokens``, so batches from several calls concatenate.

Life cycle inside a colocated worker (see :meth:`rlplat.workers.roles.ActorRolloutRefWorker.rollout_mode`):
``wake_up(("weights",))`` → :meth:`RolloutEngine.load_weights` when the actor changed →
``wake_up(("kv_cache",))`` → :meth:`RolloutEngine.generate` → :meth:`RolloutEngine.sleep`, so the
engine's memory is free while the actor trains. Engines without a sleep mode treat both as no-ops.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch

from rlplat.config.errors import ConfigError
from rlplat.config.plan import RolloutDeclaration
from rlplat.models.shape import ModelShape
from rlplat.protocol import Batch
from rlplat.registry import Registry
from rlplat.sequence import position_ids_from_mask

WeightBucket = list[tuple[str, torch.Tensor]]  # (Hugging Face name, full tensor) pairs sent together
LOAD_FORMATS = ("dummy", "auto")  # dummy = random init, the actor's weights arrive first | auto = read the model


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    stop_token_ids: tuple[int, ...] = ()  # token ids that end a response besides EOS (kept in the response)
    ignore_eos: bool = False  # EOS does not end a response (it is sampled and kept like any token)
    # None: the engine's own random stream. An int makes the call reproducible and leaves that stream
    # untouched (validation uses it, so its schedule never changes the training samples).
    seed: int | None = None

    def stop_ids(self, eos_token_id: int) -> list[int]:
        """The ids that end a response: EOS (unless ``ignore_eos``), then ``stop_token_ids``."""
        return [*([] if self.ignore_eos else [eos_token_id]), *self.stop_token_ids]


@dataclass(frozen=True)
class RolloutSetup:
    """What every rollout engine needs to know about the run, whatever the engine."""

    model_path: str
    tokenizer_path: str
    device: torch.device
    dtype: torch.dtype  # the dtype the engine generates in (weights are sent in it)
    eos_token_id: int
    pad_token_id: int
    max_model_len: int  # data.max_prompt_length + the response length (RunPlan.response_length)
    seed: int
    rank: int
    world_size: int
    trust_remote_code: bool = False
    lora_rank: int = 0  # rollout.lora_sync=adapter: the rank of the LoRA adapters it applies (0: none)
    frozen_vision: bool = False  # actor.vision.freeze: a vision-language model's vision tower is never synced

    @property
    def dtype_name(self) -> str:
        """``dtype`` as inference engines spell it: "float32", "bfloat16", "float16"."""
        return str(self.dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Sample:
    """One sampled continuation of a token-id prompt (:meth:`RolloutEngine.generate_ids`)."""

    ids: list[int]
    log_probs: list[float]  # log-softmax(logits / temperature) of each sampled id
    stopped: bool  # ended at EOS or a stop id (False: it reached max_new_tokens)
    # a mixture of experts' routing of the prompt and the sampled ids, [len(prompt) + len(ids), layers, top_k] int16:
    # each token's experts in the forward that first fed it (-1: none; the last id is fed by no forward), when the
    # engine returns routing (its declaration's returns_routing), else None
    routing: torch.Tensor | None = None


class NonFiniteLogitsError(RuntimeError):
    """The policy's logits were NaN or infinite while sampling: its weights or activations are not finite (a
    diverged update, a float16 overflow). Raised by the engines that can see their logits."""


class UpdateSlot:
    """Where a weight update waits for the generation under way to take it between two tokens
    (``rollout.partial=resume``): the rollout worker offers a callable that loads it, the engine takes it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._update: Callable[[], None] | None = None

    def offer(self, update: Callable[[], None]) -> None:
        with self._lock:
            self._update = update

    def take(self) -> Callable[[], None] | None:
        with self._lock:
            update, self._update = self._update, None
            return update


class RolloutEngine(ABC):
    """Interface of the generation backends (registry: ``ROLLOUT_ENGINES``, key ``rollout.name``).

    An engine is built from the run's :class:`RolloutSetup` and its own config section
    (``rollout.<name>``), and reads nothing else.
    """

    #: whether :meth:`load_weights` must run before the first generation (weights not read from disk)
    needs_initial_weights: bool = False
    setup: RolloutSetup  # kept by every engine's __init__
    #: ``rollout.partial=resume``: the rollout worker's updates, which :meth:`generate` takes between two tokens
    #: (engines that declare ``pauses_for_updates``); the output then has, per row, how many of the
    #: call's updates were loaded before its first token (``weight_updates_before`` ``[B]``) and while it was
    #: sampled (``weight_updates`` ``[B]``)
    updates: UpdateSlot | None = None

    @property
    def weights_discarded_by_sleep(self) -> bool:
        """True when :meth:`sleep` dropped the weights, so they must be sent again after waking up."""
        return False

    @abstractmethod
    def __init__(self, setup: RolloutSetup, engine_cfg): ...

    @classmethod
    def check_config(cls, engine_cfg, key: str, device: str) -> None:
        """Raise ConfigError, naming the key, for a value of the engine's own section ``key``
        (``rollout.<name>``) that it cannot run with on ``device`` ("cpu" | "cuda"); called at start-up."""

    @classmethod
    def declare(cls, engine_cfg, device: str) -> RolloutDeclaration:
        """What this engine does with its section ``engine_cfg`` on ``device`` ("cpu" | "cuda"), for the run
        plan and the start-up checks: by default it generates in bfloat16 on a GPU and float32 on CPU
        (``rollout.dtype=auto``), its own model code computes the log-probs, it keeps its memory between
        rollouts, and it has none of the abilities a :class:`RolloutDeclaration` lists after those (an engine
        that overrides :meth:`load_adapters`, :meth:`weight_checksums` or :meth:`sequence_log_probs` says so
        here)."""
        return RolloutDeclaration(auto_dtype="bfloat16" if device == "cuda" else "float32", actor_log_probs=False,
                                  sleeps=False)

    @classmethod
    def memory(cls, shape: ModelShape, engine_cfg, key: str, dtype: str, device: str, sequences: int, length: int,
               device_memory: int, lent_weights: bool) -> tuple[dict[str, float], str]:
        """Its memory on one device (the plan's estimate, :mod:`rlplat.planner`) while it generates ``sequences``
        of up to ``length`` tokens in ``dtype`` with its section ``engine_cfg`` (``key``), by named part in
        bytes, and the knob to turn when it does not fit. ``lent_weights``: the actor's live weights are whole
        on this worker (``TrainingEngine.lends_weights``). By default a copy of the weights and a KV cache of
        every sequence."""
        size = getattr(torch, dtype).itemsize
        return ({f"rollout weights ({dtype})": size * shape.params,
                 f"KV cache ({sequences} sequences x {length} tokens)": sequences * length * shape.kv_cache_bytes_per_token(size)},
                "fewer sequences per rollout worker, or a lower data.max_response_length")

    @abstractmethod
    def generate(self, batch: Batch, params: SamplingParams) -> Batch:
        """Sample one response per row of ``batch`` (repeat rows first for n > 1)."""

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams,
                     continues: list[int | None] | None = None) -> list[Sample]:
        """Sample one continuation per prompt given as token ids (of any lengths): the call an agent loop
        makes for each turn, with the conversation so far as the prompt. ``continues`` (an agent loop's
        turns): for each prompt, the index of the previous call's sample it extends (that call's prompt
        and sampled ids are where it starts), or None; an engine may keep what it computed for the samples
        of a call with ``continues`` so that the next turn runs only the new tokens, until
        :meth:`end_conversations`. By default the hint is not used (vLLM's prefix caching finds the
        shared prefixes itself) and the prompts are left-padded into a batch for :meth:`generate`."""
        if not prompts:
            return []
        ids, mask = left_padded(prompts, self.setup.pad_token_id)
        out = self.generate(Batch.from_dict({"prompts": ids, "prompt_mask": mask}), params).tensors
        samples = samples_of(out["responses"], out["rollout_log_probs"], out["response_mask"].sum(-1).tolist(),
                             params.stop_ids(self.setup.eos_token_id))
        if "routed_experts" not in out:
            return samples
        width = out["input_ids"].shape[1] - out["responses"].shape[1]  # the left-padded prompts'
        return [replace(sample, routing=routed[width - len(prompt):width + len(sample.ids)])
                for sample, prompt, routed in zip(samples, prompts, out["routed_experts"])]

    def end_conversations(self) -> None:
        """Drop what :meth:`generate_ids` kept for continuing the conversations (the agent loop is done)."""

    @abstractmethod
    def load_weights(self, buckets: Iterable[WeightBucket]) -> None:
        """Replace the engine's weights with the streamed buckets of (Hugging Face name, full tensor)
        pairs; every weight arrives exactly once. Caches computed with the old weights are dropped."""

    def share_weights(self, weights: dict[str, torch.Tensor]) -> bool:
        """Use the training engine's live tensors (Hugging Face names, updated in place by its optimizer)
        as this engine's weights, without a copy, when dtype, device and names allow; False when this
        engine cannot (it then receives copies through :meth:`load_weights`)."""
        return False

    def load_adapters(self, buckets: Iterable[WeightBucket], lora_cfg) -> None:
        """Apply the actor's LoRA adapters (``rollout.lora_sync=adapter``): ``buckets`` hold only the adapter
        tensors (peft's names, e.g. ``...q_proj.lora_A.default.weight``) of ``model.lora``; the engine keeps its
        base weights. An engine that can declares ``applies_adapters`` (:meth:`declare`)."""
        raise NotImplementedError(f"{type(self).__name__} cannot apply LoRA adapters")

    def weight_checksums(self) -> dict | None:
        """:func:`rlplat.rollout.checksums.named_checksums` of the weights the engine holds, under the Hugging
        Face names :meth:`load_weights` received them by, for ``rollout.verify_weights``; None when the
        engine cannot show them so (it holds them fused, or in another process)."""
        return None

    def sequence_log_probs(self, ids: list[int]) -> list[float] | None:
        """The log-prob at temperature 1 of each of ``ids[1:]`` given the tokens before it, computed as the
        engine computes when it samples: the weight sync's probe (``rollout.verify_weights``). None when the
        engine cannot score a given sequence."""
        return None

    def sleep(self) -> None:
        """Free the engine's device memory (KV cache, and weights where supported) while training runs."""

    def wake_up(self, tags: tuple[str, ...] = ("weights", "kv_cache")) -> None:
        """Undo :meth:`sleep` for the given memory kinds, before loading weights / generating."""

    def close(self) -> None:
        """Release the engine (processes, process groups) before its worker goes away."""


def reservation(shape: ModelShape, engine_cfg, key: str, fraction_key: str, dtype: str, device: str,
                device_memory: int) -> tuple[dict[str, float], str]:
    """The memory of an engine that reserves a fraction ``engine_cfg.<fraction_key>`` of a GPU's memory for its
    weights and KV cache (vLLM, SGLang); on CPU its weights (over ``tensor_parallel_size`` workers) and a KV cache
    of ``kv_cache_gb`` (1 GiB if unset). The parts and the knob, as :meth:`RolloutEngine.memory`."""
    fraction, name = engine_cfg[fraction_key], key.rpartition(".")[2]
    reserved = fraction * device_memory if device == "cuda" else \
        (engine_cfg.get("kv_cache_gb") or 1) * 2**30 + getattr(torch, dtype).itemsize * shape.params / engine_cfg.tensor_parallel_size
    return ({f"{name} reservation ({key}.{fraction_key}={fraction:g})": reserved},
            f"lower {key}.{fraction_key}, or {key}.tensor_parallel_size > 1")


def check_load_format(engine_cfg, key: str) -> None:
    """``load_format`` of the engines that can start from random weights (the actor's arrive before use)."""
    if engine_cfg.load_format not in LOAD_FORMATS:
        raise ConfigError(f"{key}.load_format={engine_cfg.load_format!r} is not one of: {', '.join(LOAD_FORMATS)}")


def check_fraction(engine_cfg, key: str, name: str) -> None:
    value = engine_cfg[name]
    if not 0 < value <= 1:
        raise ConfigError(f"{key}.{name} must be in (0, 1], got {value}")


ROLLOUT_ENGINES: Registry[type[RolloutEngine]] = Registry("rollout engine")
# Clients of an already running inference server (rollout.mode=server), by the server's engine name.
ROLLOUT_SERVER_CLIENTS: Registry[type[RolloutEngine]] = Registry("rollout server client")


def assemble_rollout(
    prompts: Batch, responses: torch.Tensor, response_mask: torch.Tensor, rollout_log_probs: torch.Tensor,
    attended: torch.Tensor | None = None,
) -> Batch:
    """Join prompts and responses into the Batch layout documented in this module. ``attended`` ``[B, R]``:
    the response tokens attended to, when they are more than the trained ones (``response_mask``): a
    multi-turn trajectory's observation tokens are attended to and not trained."""
    prompt_ids, prompt_mask = prompts.tensors["prompts"], prompts.tensors["prompt_mask"]
    attended = response_mask if attended is None else attended
    attention_mask = torch.cat([prompt_mask.long(), attended.long()], dim=1)
    generated = Batch.from_dict(
        tensors={
            "responses": responses,
            "response_mask": response_mask.long(),
            "rollout_log_probs": rollout_log_probs * response_mask,
            "input_ids": torch.cat([prompt_ids, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask),
        }
    )
    return prompts.union(generated)


#: the fields of a generated batch that start with the prompt (left-padded to the batch's longest)
PROMPT_SIDE_FIELDS = ("prompts", "prompt_mask", "input_ids", "attention_mask", "position_ids")


def join_rollouts(batches: list[Batch], pad_token_id: int) -> Batch:
    """Generated batches (the layout of this module) as one, rows in order: each batch's prompt side is
    left-padded to the widest prompt first (every batch pads its prompts to its own longest)."""
    widths = {batch.tensors["prompts"].shape[1] for batch in batches if "prompts" in batch.tensors.keys()}
    if len(widths) <= 1:
        return Batch.concat(batches)
    width = max(widths)
    padded = []
    for batch in batches:
        extra = width - batch.tensors["prompts"].shape[1]
        if extra:
            fields = {key: torch.nn.functional.pad(batch.tensors[key], (extra, 0), value=pad_token_id if key in
                                                   ("prompts", "input_ids") else 0)
                      for key in PROMPT_SIDE_FIELDS}
            if "routed_experts" in batch.tensors.keys():  # [B, P + R, layers, top_k]: -1 = no routing
                routed = batch.tensors["routed_experts"]
                fields["routed_experts"] = torch.cat([routed.new_full((len(routed), extra, *routed.shape[2:]), -1),
                                                      routed], dim=1)
            batch = batch.select(tensor_keys=[k for k in batch.tensors.keys() if k not in fields]).union(
                Batch.from_dict(fields))
        padded.append(batch)
    return Batch.concat(padded)


def pad_responses(
    token_ids: list[list[int]], log_probs: list[list[float]], max_new_tokens: int, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad per-sequence token ids and log-probs (as engines return them) to ``[B, max_new_tokens]``.

    Returns ``(responses, response_mask, log_probs)``. The mask comes from each sequence's length, not
    from searching the EOS id, because many tokenizers use the EOS id as the pad id.
    """
    ids = torch.full((len(token_ids), max_new_tokens), pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(token_ids), max_new_tokens, dtype=torch.long)
    lps = torch.zeros(len(token_ids), max_new_tokens, dtype=torch.float32)
    for row, (toks, lp) in enumerate(zip(token_ids, log_probs)):
        if len(toks) > max_new_tokens or len(lp) != len(toks):
            raise ValueError(f"engine returned {len(toks)} tokens and {len(lp)} log-probs for a row "
                             f"(max_new_tokens={max_new_tokens})")
        ids[row, : len(toks)] = torch.as_tensor(toks, dtype=torch.long)
        mask[row, : len(toks)] = 1
        lps[row, : len(lp)] = torch.as_tensor(lp, dtype=torch.float32)
    return ids, mask, lps


def left_padded(prompts: list[list[int]], pad_token_id: int,
                device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists of any lengths as one left-padded batch: ids and mask ``[B, longest]``."""
    width = max(len(ids) for ids in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long, device=device)
    mask = torch.zeros(len(prompts), width, dtype=torch.long, device=device)
    for row, tokens in enumerate(prompts):
        if tokens:
            ids[row, width - len(tokens):] = torch.as_tensor(tokens, dtype=torch.long)
            mask[row, width - len(tokens):] = 1
    return ids, mask


def samples_of(tokens: torch.Tensor, log_probs: torch.Tensor, lengths: list[int], stops: list[int]) -> list[Sample]:
    """Each row's first ``lengths`` sampled ids ``tokens`` ``[B, R]`` and their log-probs as a :class:`Sample`
    (stopped: its last id is one of ``stops``)."""
    samples = []
    for ids, row_log_probs, length in zip(tokens.tolist(), log_probs.tolist(), lengths):
        sampled = ids[:length]
        samples.append(Sample(sampled, row_log_probs[:length], bool(sampled) and sampled[-1] in stops))
    return samples


def prompt_token_lists(prompts: Batch) -> list[list[int]]:
    """The prompts without their left padding, as lists of ids (the input of token-level engine APIs)."""
    ids, mask = prompts.tensors["prompts"], prompts.tensors["prompt_mask"].bool()
    return [row[m].tolist() for row, m in zip(ids, mask)]

