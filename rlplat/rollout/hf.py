"""Hugging Face transformers rollout engine (the embedded default).

Holds the policy unsharded on the worker's device. When the training engine holds the weights whole on
the same device in the same dtype (one worker, e.g. CPU float32), the engine uses the actor's own tensors
(:meth:`HFRolloutEngine.share_weights`): one model in memory and nothing to copy after an update.
Otherwise it holds its own copy and receives the actor's weights after each update (:meth:`load_weights`);
vLLM and SGLang are the engines for large models.

Sampling is rlplat's own loop (:meth:`HFRolloutEngine._sample`) over a forward pass with a KV cache: for
dense Qwen2 / Llama models a short one over the model's own weights, checked against the model's forward
at start-up (:mod:`rlplat.rollout.decoder`; ``rollout.hf.dense_forward=false`` turns it off), else the
model's forward. Stopped rows leave the batch, and the distribution is exactly rlplat's settings
(temperature, top-k, top-p; no penalties). Rollout log-probs are ``log_softmax(raw logits / temperature)`` of the sampled token, the
same quantity the training engine recomputes (top-p/top-k only restrict sampling). The model directory's
``generation_config.json`` (which may set top-k, repetition penalties, ...) is ignored unless
``rollout.hf.use_model_generation_config=true``, which samples with transformers' ``generate`` on top of it.

In an agent loop's conversations (:meth:`HFRolloutEngine.generate_ids` with ``continues``) the dense forward
keeps each trajectory's keys and values between turns, and the next turn runs only the tokens added since
(the last sampled token and the observation): the earlier turns are not computed again.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch

from rlplat.config.plan import RolloutDeclaration
from rlplat.data.vision import MULTI_MODAL
from rlplat.models.moe import NO_ROUTING, RouterTap, is_moe
from rlplat.models.vision import (
    image_inputs, is_vision, load_generative, rope_positions, vision_parameters, vision_token_ids,
    without_vision_tokens,
)
from rlplat.protocol import Batch
from rlplat.rollout.base import (
    NonFiniteLogitsError, RolloutEngine, RolloutSetup, Sample, SamplingParams, WeightBucket, assemble_rollout,
    left_padded, samples_of,
)
from rlplat.rollout.decoder import DenseForward, KeptCache, ModelForward, matches_model
from rlplat.rollout.checksums import named_checksums
from rlplat.sequence import position_ids_from_mask, response_log_probs, response_mask_from_ids


class _RoutingLog:
    """The experts each token of a batch of generations went to, ``[rows, width, layers, top_k]`` int16 (``-1``
    where no forward routed one: padding, and the last token, which no forward reads), filled by the forward passes
    that run inside :meth:`record`: each token's routing when it was first fed, so an update between two tokens
    leaves the earlier tokens' routing as the weights that sampled them routed it. Without a ``tap`` (a dense
    model, or rows that continue a conversation) it records nothing and ``experts`` is None."""

    def __init__(self, tap: RouterTap | None, rows: int, width: int, device):
        self.tap = tap
        self.experts = None if tap is None else torch.full(
            (rows, width, len(tap.routers), tap.top_k), NO_ROUTING, dtype=torch.int16, device=device)

    @contextlib.contextmanager
    def record(self, rows: torch.Tensor, first: int, attended: torch.Tensor | None = None):
        """Around a forward over ``rows`` (indices of the batch's rows) whose tokens are the rows' positions from
        ``first`` on; ``attended`` marks its real tokens (padding keeps -1)."""
        if self.tap is None:
            yield
            return
        with self.tap.recording() as routing:
            yield
        experts = routing.stacked().view(len(rows), -1, *self.experts.shape[2:])
        if attended is not None:
            experts = experts.masked_fill(~attended.bool()[..., None, None], NO_ROUTING)
        self.experts[rows, first:first + experts.shape[1]] = experts


@dataclass
class _Conversation:
    """A sample's tokens whose keys and values are kept for its conversation's next turn: the prompt and the
    sampled ids but the last (which the next turn feeds)."""

    ids: list[int]
    k: torch.Tensor  # [layers, kv_heads, len(ids), head_dim]
    v: torch.Tensor


class HFRolloutEngine(RolloutEngine):
    @classmethod
    def declare(cls, engine_cfg, device: str) -> RolloutDeclaration:
        """It samples with the actor's Hugging Face model code (or the dense forward, checked against it at
        start-up), so in float32 its log-probs are the actor's own to float error; it applies adapters, shows
        its weights and scores a sequence; its own sampling loop pauses for an update between two tokens, returns a
        mixture of experts' routing and takes images (not transformers' ``generate``: ``use_model_generation_config``)."""
        return replace(super().declare(engine_cfg, device), actor_log_probs=True, applies_adapters=True,
                       shows_weights=True, scores_sequences=True,
                       pauses_for_updates=not engine_cfg.use_model_generation_config,
                       returns_routing=not engine_cfg.use_model_generation_config,
                       takes_images=not engine_cfg.use_model_generation_config,
                       images_refused_because="use_model_generation_config samples with transformers' generate, "
                                              "which is not given the images" if engine_cfg.use_model_generation_config
                                              else "")

    @classmethod
    def memory(cls, shape, engine_cfg, key, dtype, device, sequences, length, device_memory, lent_weights):
        """A KV cache of ``batch_size_seqs_per_worker`` sequences at a time, and a copy of the weights unless it
        samples with the actor's own (whole on the worker and in float32; not LoRA's merged weights)."""
        rows = min(engine_cfg.batch_size_seqs_per_worker, sequences)
        parts, _ = super().memory(shape, engine_cfg, key, dtype, device, rows, length, device_memory, lent_weights)
        if lent_weights and dtype == "float32":
            del parts[f"rollout weights ({dtype})"]
        return parts, f"lower {key}.batch_size_seqs_per_worker, data.max_response_length or the batch"

    def __init__(self, setup: RolloutSetup, engine_cfg):
        self.setup = setup
        self.device, self.eos_token_id, self.pad_token_id = setup.device, setup.eos_token_id, setup.pad_token_id
        self.batch_size_seqs = engine_cfg.batch_size_seqs_per_worker
        self.model = load_generative(setup.model_path, dtype=setup.dtype,
                                     trust_remote_code=setup.trust_remote_code).to(setup.device)
        self.vision = is_vision(self.model.config)  # prompts may show images (rlplat.models.vision)
        # the tokens no response holds (a VLM's vision tokens): out of the policy's softmax, as in the trainer's
        self.vision_tokens = torch.tensor(vision_token_ids(self.model.config), device=setup.device) \
            if self.vision else None
        self.model.eval().requires_grad_(False)
        self.use_model_generation_config = engine_cfg.use_model_generation_config
        self.forward = self._choose_forward(engine_cfg.dense_forward, setup)
        # a mixture of experts: the experts each sampled token went to (routing replay, rlplat.engines.routing)
        self.router_tap = RouterTap(self.model, aux_loss_coef=0.0) if is_moe(self.model.config) else None
        self._kept: list[_Conversation] | None = None  # the last generate_ids call's samples, to continue
        self._updates_taken = 0

    def _choose_forward(self, dense: bool, setup: RolloutSetup):
        """The dense forward when the model is one it computes and its logits agree with the model's
        (float32: 1e-4; lower precisions: 5e-2), else the model's own."""
        forward = DenseForward.of(self.model) if dense else None
        if forward is None:
            return ModelForward(self.model)
        gap = matches_model(forward, self.model, 1e-4 if setup.dtype == torch.float32 else 5e-2)
        if gap is not None:
            if setup.rank == 0:
                print(f"[rollout] the dense forward's logits differ from {type(self.model).__name__}'s by {gap:.2e}: "
                      f"sampling with the model's own forward", flush=True)
            return ModelForward(self.model)
        return forward

    def _generation_config(self, params: SamplingParams):
        """``rollout.hf.use_model_generation_config=true``: the model's file is the base; rlplat's
        temperature, and top-p/top-k where set, override it."""
        greedy = params.temperature == 0
        config = copy.deepcopy(self.model.generation_config)
        config.update(do_sample=not greedy, temperature=params.temperature or 1.0,
                      max_new_tokens=params.max_new_tokens, eos_token_id=params.stop_ids(self.eos_token_id) or None,
                      pad_token_id=self.pad_token_id, output_logits=True, return_dict_in_generate=True)
        if params.top_p < 1:
            config.top_p = params.top_p
        if params.top_k > 0:
            config.top_k = params.top_k
        return config

    @torch.no_grad()
    def _generate_chunk(self, prompts: Batch, params: SamplingParams) -> Batch:
        ids = prompts.tensors["prompts"].to(self.device)
        mask = prompts.tensors["prompt_mask"].to(self.device)
        before = self._updates_taken  # loaded by earlier chunks of this call: before these rows' first token
        if self.use_model_generation_config:
            generated, log_probs = self._generate_with_transformers(ids, mask, params)
            updates = torch.zeros(ids.shape[0], dtype=torch.long)
        else:
            images = _Images.of(self.model, ids, mask, prompts.non_tensors.get(MULTI_MODAL)) if self.vision else None
            generated, log_probs, updates, routed = self._sample(ids, mask, params, images=images)
        if not bool(torch.isfinite(log_probs).all()):  # greedy decoding picks a NaN logit without complaint
            raise NonFiniteLogitsError("the sampled tokens' log-probs are NaN or infinite")
        response_mask = response_mask_from_ids(generated, tuple(params.stop_ids(self.eos_token_id)))
        generated = generated.masked_fill(response_mask == 0, self.pad_token_id)
        out = assemble_rollout(prompts, generated.cpu(), response_mask.cpu(), log_probs.float().cpu())
        if self.updates is not None:
            out = out.union(Batch.from_dict({"weight_updates_before": torch.full_like(updates.cpu(), before),
                                             "weight_updates": updates.cpu()}))
        if not self.use_model_generation_config and routed is not None:
            out = out.union(Batch.from_dict({"routed_experts": routed.cpu()}))
        return out

    def _sample(self, ids: torch.Tensor, mask: torch.Tensor, params: SamplingParams, kept: KeptCache | None = None,
                held: torch.Tensor | None = None, keep_rows: dict | None = None, images: _Images | None = None):
        """Sample up to ``max_new_tokens`` per row with the KV cache; rows that have stopped leave the batch
        (their cache rows are dropped once a quarter of the batch has stopped), so a batch of varied
        lengths costs the tokens it generates, not its longest response times its size. Returns
        ``[B, max_new_tokens]`` tokens (pad after a stop), their log-probs under softmax(logits / T), and how many
        weight updates each row took. ``kept``: the rows' earlier tokens' cache (``held`` ``[B]`` tokens each,
        which ``ids`` follow); ``keep_rows``: filled with each row's cache (prompt and sampled tokens but the last),
        by row. Without those, an update offered to :attr:`updates` is loaded between two tokens and the rows
        still sampling go on under it: their cache is computed again with the new weights (prompt and tokens so
        far), so each token's log-prob is exactly that of the weights that sampled it. A mixture of experts'
        single-turn rows (no ``kept`` or ``held``) also return the experts each token went to (:class:`_RoutingLog`),
        else None. ``images``: a vision-language model's prompt images and 3-D positions."""
        rows, limit = ids.shape[0], params.max_new_tokens
        pausable = self.updates is not None and kept is None and held is None and keep_rows is None
        # per row, the tokens its cache will hold when it stops: its context, then each sampled token but the last
        out = _Sampled.empty(rows, limit, self.pad_token_id, mask.sum(-1) + (0 if held is None else held) - 1)
        stops = torch.tensor(params.stop_ids(self.eos_token_id), dtype=torch.long, device=self.device)
        live = torch.arange(rows, device=self.device)  # the original row of each row still in the batch
        done = torch.zeros(rows, dtype=torch.bool, device=self.device)
        # [B, P] (a VLM's [B, P, 3]: a token's next position is its row's last plus one all the same)
        positions = images.positions if images is not None else position_ids_from_mask(mask) + (
            0 if held is None else held[:, None])
        routed = _RoutingLog(self.router_tap if kept is None and held is None else None, rows, ids.shape[1] + limit,
                             self.device)
        try:
            with routed.record(torch.arange(rows, device=self.device), 0, mask):
                logits = self.forward.start(ids, mask, positions, limit, kept,
                                            images.inputs(range(rows), self.device) if images else None)
            kept = None  # copied into the forward's cache
            positions = positions[:, -1]
            for step in range(limit):
                token, token_log_probs = self._choose(logits, params)
                writing = ~done  # the rows that sample a token this step (and feed it next: the routing log)
                out.write(live[writing], step, token[writing], token_log_probs[writing])
                done |= torch.isin(token, stops)
                if step == limit - 1 or bool(done.all()):
                    break
                if int(done.sum()) * 4 >= len(done):  # compact: the stopped rows leave the batch
                    keep = (~done).nonzero().squeeze(-1)
                    self._keep_rows(keep_rows, done.nonzero().squeeze(-1), live, out.cached)
                    self.forward.keep(keep)
                    live, positions, token, done = live[keep], positions[keep], token[keep], done[keep]
                    writing = writing[keep]
                positions = positions + 1
                if pausable and (update := self.updates.take()) is not None:
                    update()  # the new weights: the cache of the rows still sampling is computed again under them
                    self._updates_taken += 1
                    keep = (~done).nonzero().squeeze(-1)
                    live, positions, token, done = live[keep], positions[keep], token[keep], done[keep]
                    out.updates[live] += 1
                    logits = self._restart(ids[live], mask[live], out.tokens[live, :step + 1], limit - step - 1, images,
                                           live)
                else:  # the rows that sampled a token this step feed it; the others' input is padding
                    with routed.record(live, ids.shape[1] + step, writing[:, None]):
                        logits = self.forward.step(token, positions)
            self._keep_rows(keep_rows, torch.arange(len(live), device=self.device), live, out.cached)
        finally:  # the cache (every layer x row x token) is not held through the other stages
            self.forward.release()
        return out.tokens, out.log_probs, out.updates, routed.experts

    def _choose(self, logits: torch.Tensor, params: SamplingParams):
        """Each row's next token and its log-prob under softmax(logits / T), a VLM's vision tokens left out."""
        scaled = logits.float() / (params.temperature if params.temperature > 0 else 1.0)
        if self.vision_tokens is not None:
            scaled = without_vision_tokens(scaled, self.vision_tokens)
        token = choose_tokens(scaled, params)
        return token, torch.log_softmax(scaled, dim=-1).gather(-1, token[:, None]).squeeze(-1)

    def _restart(self, ids: torch.Tensor, mask: torch.Tensor, sampled: torch.Tensor, remaining: int,
                 images: _Images | None, live: torch.Tensor) -> torch.Tensor:
        """A fresh cache of the prompts ``ids`` and the tokens ``sampled`` so far (all live: none has stopped; the
        batch's rows ``live``); the logits of the next token."""
        self.forward.release()
        context = torch.cat([ids, sampled], dim=1)
        attended = torch.cat([mask, torch.ones_like(sampled)], dim=1)
        if images is None:
            return self.forward.start(context, attended, position_ids_from_mask(attended), remaining)
        prompt = images.positions[live]
        after = prompt[:, -1:] + torch.arange(1, sampled.shape[1] + 1, device=prompt.device)[None, :, None]
        return self.forward.start(context, attended, torch.cat([prompt, after], dim=1), remaining,
                                  images=images.inputs(live.tolist(), self.device))

    def _keep_rows(self, keep_rows: dict | None, current: torch.Tensor, live: torch.Tensor, cached: torch.Tensor):
        """Copy the cache of the ``current`` rows (indices into the batch as it is now) into ``keep_rows``."""
        if keep_rows is not None:
            for row, original in zip(current.tolist(), live[current].tolist()):
                keep_rows[original] = self.forward.row_cache(row, int(cached[original]))

    def _generate_with_transformers(self, ids: torch.Tensor, mask: torch.Tensor, params: SamplingParams):
        """transformers' ``generate`` with the model's generation config as the base (logits processors,
        penalties and all that it adds)."""
        out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=self._generation_config(params))
        generated = out.sequences[:, ids.shape[1] :]
        logits = torch.stack(out.logits, dim=1)  # [b, r, V], raw (before temperature / top-p)
        temperature = params.temperature if params.temperature > 0 else 1.0
        log_probs, _ = response_log_probs(logits, generated, temperature)
        pad = params.max_new_tokens - generated.shape[1]
        if pad:  # every sequence stopped early: pad to the fixed response length
            generated = torch.nn.functional.pad(generated, (0, pad), value=self.pad_token_id)
            log_probs = torch.nn.functional.pad(log_probs, (0, pad), value=0.0)
        return generated, log_probs

    def generate(self, batch: Batch, params: SamplingParams) -> Batch:
        self._kept = None
        self._updates_taken = 0  # rollout.partial=resume: the updates this call has loaded so far
        with self._random_stream(params.seed):
            return Batch.concat([self._generate_chunk(chunk, params) for chunk in batch.split(self.batch_size_seqs)])

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams,
                     continues: list[int | None] | None = None) -> list[Sample]:
        """With ``continues`` and the dense forward, a prompt that extends the previous call's sample
        ``continues[i]`` (checked token by token) starts from that sample's kept cache and runs only its new
        tokens, and every sample's cache is kept for the next call; otherwise as the base engine's."""
        kept, self._kept = self._kept or [], None
        if continues is None or not isinstance(self.forward, DenseForward) or self.use_model_generation_config:
            return super().generate_ids(prompts, params)
        samples, conversations = [], []
        with self._random_stream(params.seed):
            for start in range(0, len(prompts), self.batch_size_seqs):
                end = start + self.batch_size_seqs
                samples += self._continue(prompts[start:end], continues[start:end], kept, params, conversations)
        self._kept = conversations
        return samples

    def end_conversations(self) -> None:
        self._kept = None

    @torch.no_grad()
    def _continue(self, prompts: list[list[int]], continues: list[int | None], kept: list[_Conversation],
                  params: SamplingParams, conversations: list[_Conversation]) -> list[Sample]:
        """Sample a chunk of :meth:`generate_ids`' prompts, each from its conversation's kept cache when it has
        one, appending each sample's cache to ``conversations``."""
        earlier = []
        for prompt, index in zip(prompts, continues):
            past = kept[index] if index is not None and index < len(kept) else None
            extends = past is not None and len(prompt) > len(past.ids) and prompt[:len(past.ids)] == past.ids
            earlier.append(past if extends else None)
            if index is not None and index < len(kept):
                kept[index] = None  # a sample is continued once: its cache goes into this chunk's
        ids, mask = left_padded([prompt[len(past.ids):] if past else prompt for prompt, past in zip(prompts, earlier)],
                                self.pad_token_id, self.device)
        rows = {}
        held = torch.tensor([len(past.ids) if past else 0 for past in earlier], device=self.device)
        # the kept rows as one batch, held by _sample alone until the forward has copied them into its cache
        tokens, log_probs, _, _ = self._sample(ids, mask, params, _batched(earlier), held, keep_rows=rows)
        if not bool(torch.isfinite(log_probs).all()):
            raise NonFiniteLogitsError("the sampled tokens' log-probs are NaN or infinite")
        stops = params.stop_ids(self.eos_token_id)
        samples = samples_of(tokens, log_probs, response_mask_from_ids(tokens, tuple(stops)).sum(-1).tolist(), stops)
        for row, (prompt, sample) in enumerate(zip(prompts, samples)):
            conversations.append(_Conversation(prompt + sample.ids[:-1], *rows[row]))
        return samples

    @contextlib.contextmanager
    def _random_stream(self, seed: int | None):
        if seed is None:
            yield
            return
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(seed)
            yield

    def share_weights(self, weights: dict[str, torch.Tensor]) -> bool:
        own = dict(self.model.named_parameters(remove_duplicate=False))
        if set(own) - set(weights) or any(weights[name].dtype != param.dtype or weights[name].device != param.device
                                          or weights[name].shape != param.shape for name, param in own.items()):
            return False
        for name in own:  # the module's Parameter objects are replaced; tied names get the one shared tensor
            module_name, _, attr = name.rpartition(".")
            self.model.get_submodule(module_name)._parameters[attr] = torch.nn.Parameter(weights[name], requires_grad=False)
        return True

    def load_weights(self, buckets: Iterable[WeightBucket]) -> None:
        """Copy the actor's weights in (a frozen vision tower's are not sent: the engine keeps its own)."""
        self._kept = None
        targets = self.model.state_dict()
        if self.vision and self.setup.frozen_vision:
            tower = set(vision_parameters(self.model))
            targets = {name: t for name, t in targets.items() if name not in tower}
        _copy_in(targets, buckets, "weight", "training and rollout models differ?")

    @torch.no_grad()
    def load_adapters(self, buckets: Iterable[WeightBucket], lora_cfg) -> None:
        """The first call puts peft's LoRA layers into the engine's model (its base weights stay) and samples
        through the model's own forward from then on (the dense forward reads the base weights only); every
        call copies the adapters in."""
        from rlplat.engines.lora import inject_lora, is_adapter

        if not any(is_adapter(name) for name, _ in self.model.named_parameters()):
            inject_lora(self.model, lora_cfg)
            self.model.requires_grad_(False)
            self.forward = ModelForward(self.model)
        adapters = {name: p for name, p in self.model.named_parameters() if is_adapter(name)}
        _copy_in(adapters, buckets, "adapter", "model.lora differs between the roles?")

    def weight_checksums(self) -> dict:
        return named_checksums(self.model.state_dict().items())

    @torch.no_grad()
    def sequence_log_probs(self, ids: list[int]) -> list[float]:
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        logits = self.model(input_ids=x).logits[0, :-1].float()
        if self.vision_tokens is not None:
            logits = without_vision_tokens(logits, self.vision_tokens)
        return torch.log_softmax(logits, dim=-1).gather(-1, x[0, 1:, None]).squeeze(-1).cpu().tolist()


@dataclass
class _Sampled:
    """What :meth:`HFRolloutEngine._sample` writes by original row: ``[B, max_new_tokens]`` tokens (pad after a
    stop) and their log-probs, how many weight updates each row took, and how many tokens its cache holds."""

    tokens: torch.Tensor
    log_probs: torch.Tensor
    updates: torch.Tensor
    cached: torch.Tensor

    @classmethod
    def empty(cls, rows: int, limit: int, pad: int, cached: torch.Tensor) -> _Sampled:
        device = cached.device
        return cls(torch.full((rows, limit), pad, dtype=torch.long, device=device),
                   torch.zeros(rows, limit, dtype=torch.float32, device=device),
                   torch.zeros(rows, dtype=torch.long, device=device), cached)

    def write(self, rows: torch.Tensor, step: int, tokens: torch.Tensor, log_probs: torch.Tensor) -> None:
        self.tokens[rows, step] = tokens
        self.log_probs[rows, step] = log_probs
        self.cached[rows] += 1


@dataclass
class _Images:
    """A batch of prompts' images for a vision-language model: each token's 3-D rotary position ``[B, P, 3]``
    and each row's image inputs (rlplat.models.vision)."""

    positions: torch.Tensor
    multi_modal: list | None

    @classmethod
    def of(cls, model, ids: torch.Tensor, mask: torch.Tensor, multi_modal) -> _Images:
        return cls(rope_positions(model, ids, mask, multi_modal), None if multi_modal is None else list(multi_modal))

    def inputs(self, rows, device) -> dict[str, torch.Tensor]:
        """The image inputs of ``rows`` (the batch's row indices, in the order of the forward's rows)."""
        return image_inputs(self.multi_modal, list(rows), device)


def _batched(earlier: list[_Conversation | None]) -> KeptCache | None:
    """The kept caches of a chunk's rows as one batch (None when no row has one); ``earlier`` is emptied, so
    the batch is the only copy left once the rows' entries are dropped."""
    pasts = [(past.k, past.v) if past else None for past in earlier]
    earlier.clear()
    if not any(pasts):
        return None
    return KeptCache.of_rows(pasts, next(k for k, _ in filter(None, pasts)))


@torch.no_grad()
def _copy_in(targets: dict[str, torch.Tensor], buckets: Iterable[WeightBucket], what: str, hint: str) -> None:
    """Copy each streamed (name, tensor) into ``targets[name]`` (cast to its device and dtype); every target
    must arrive: a name the model lacks, or a target left out, is an error naming it."""
    seen = set()
    for bucket in buckets:
        for name, tensor in bucket:
            if name not in targets:
                raise KeyError(f"rollout model has no {what} {name!r} ({hint})")
            targets[name].copy_(tensor.to(targets[name].device, targets[name].dtype))
            seen.add(name)
    if missing := sorted(set(targets) - seen):
        raise KeyError(f"the sync left {len(missing)} rollout {what}s untouched, e.g. {missing[:3]}")


def choose_tokens(scaled: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """One token per row from logits already divided by the temperature: the argmax when greedy, else a
    draw from the softmax of :func:`restrict_logits`."""
    if params.temperature == 0:
        return scaled.argmax(-1)
    probs = restrict_logits(scaled, params).softmax(-1)
    try:
        return torch.multinomial(probs, 1).squeeze(-1)
    except RuntimeError:
        if not bool(torch.isfinite(probs).all()):
            raise NonFiniteLogitsError("the sampling probabilities are NaN or infinite") from None
        raise


def restrict_logits(scaled: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The logits with -inf outside the top-k, then outside the smallest set of tokens holding ``top_p``
    of the probability (transformers' top-k and top-p warpers, in that order)."""
    if 0 < params.top_k < scaled.shape[-1]:
        kth = scaled.topk(params.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        ascending, order = scaled.sort(dim=-1)
        tail = ascending.softmax(-1).cumsum(-1) <= 1 - params.top_p  # the least likely tokens, 1 - top_p in all
        tail[:, -1] = False  # the most likely token always stays
        scaled = scaled.masked_fill(torch.zeros_like(tail).scatter(-1, order, tail), float("-inf"))
    return scaled
