"""PyTorch FSDP2 training engine: ``fully_shard`` per decoder layer, then the root module.

fp32 everywhere on CPU (bf16 matmul is far slower than fp32 on CPU; measured figures: docs/performance.md);
on GPU fp32 master weights with bf16 compute and fp32 gradient reduction (``MixedPrecisionPolicy``),
optional CPU offload of parameters and optimizer state. The optimizer is
:class:`rlplat.engines.optim.Optimizer`. Every worker is its own data-parallel replica.

Memory: a causal LM with a plain output layer runs as :class:`rlplat.engines.token_head.TokenOutputLM` (its
own decoder and output layer, under the same names), which computes log-probs, entropy and Σπ² without full
logits; Llama/Qwen-style MLPs keep half their activations for the backward pass
(:mod:`rlplat.engines.gated_mlp`); as a plain module (one worker, fp32, no offloading) the gradients and
AdamW's moments live in flat buffers for the whole run (:func:`rlplat.engines.optim.attach_flat_grads`).

Gradients: FSDP averages gradients over the data-parallel ranks, while rlplat's losses are normalised by
global (whole mini-batch) denominators and must be *summed* over ranks;
:meth:`FSDPEngine.backward` therefore multiplies the loss by the data-parallel size.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math

import torch
from omegaconf import DictConfig

from rlplat.config.derive import model_of
from rlplat.config.errors import ConfigError
from rlplat.engines.base import (
    TRAINING_ENGINES, ForwardOutput, ParallelLayout, TrainingEngine, blend_, check_blended, check_mixed_precision,
    load_rank_state, save_rank_state,
)
from rlplat.engines.dist import DistContext
from rlplat.engines.gated_mlp import install_gated_mlp
from rlplat.engines.lora import LoRA, bucketed, inject_lora, owner
from rlplat.engines.memory import MemoryLayout, model_state
from rlplat.engines.optim import Optimizer
from rlplat.engines.packing import PackedBatch
from rlplat.engines.routing import RoutedForward
from rlplat.engines.token_head import TOKEN_HEADS, TokenOutputLM
from rlplat.engines.ulysses import ATTENTION as ULYSSES
from rlplat.engines.ulysses import SequenceShard, check_heads, sharded, split_rows
from rlplat.engines.ulysses import register as register_ulysses
from rlplat.models.embedded import known_config
from rlplat.models.moe import RouterTap, is_moe
from rlplat.models.vision import (
    image_inputs, is_vision, load_generative, model_positions, rope_positions, vision_parameters, vision_token_ids,
    without_vision_tokens,
)
from rlplat.data.vision import MULTI_MODAL
from rlplat.protocol import Batch
from rlplat.sequence import position_ids_from_mask, response_log_probs


def load_hf_model(path: str, model_cfg: DictConfig, value_head: bool = False) -> torch.nn.Module:
    """Load a causal LM (a vision-language model's generative model: rlplat.models.vision; or, with
    ``value_head``, the same backbone with a 1-output token head) in fp32."""
    from transformers import AutoModelForTokenClassification

    kwargs = dict(
        dtype=torch.float32,
        trust_remote_code=model_cfg.trust_remote_code,
        attn_implementation=model_cfg.attn_implementation,
    )
    if value_head:
        return AutoModelForTokenClassification.from_pretrained(path, num_labels=1, **kwargs)
    return load_generative(path, **kwargs)


def check_token_head(engine_cfg: DictConfig, key: str, device: str) -> None:
    """``token_head`` is one of TOKEN_HEADS, and ``liger`` has what it runs on: a GPU and liger-kernel."""
    head = engine_cfg.token_head
    if head != "auto" and head not in TOKEN_HEADS:
        raise ConfigError(f"{key}.token_head={head!r}: expected auto or one of {', '.join(TOKEN_HEADS)}")
    if head == "liger":
        if device != "cuda":
            raise ConfigError(f"{key}.token_head=liger runs liger-kernel's Triton kernels, which need a GPU "
                              f"(trainer.device resolved to {device}): use fused or chunked")
        if importlib.util.find_spec("liger_kernel") is None:
            raise ConfigError(f"{key}.token_head=liger needs the liger-kernel package: pip install liger-kernel, "
                              f"or use {key}.token_head=fused")


def token_head_of(fsdp_cfg, device: str) -> str:
    """The output layer's head on ``device`` (``token_head``; auto: fused on a GPU, chunked on CPU)."""
    head = fsdp_cfg.token_head
    return head if head != "auto" else "fused" if device == "cuda" else "chunked"


def compiles(fsdp_cfg, device: str, dense_text: bool) -> bool:
    """Whether the decoder layers are compiled (``compile``; None: on a GPU, for a ``dense_text`` model without
    Ulysses; mixtures of experts and vision-language models stay eager: not measured yet)."""
    if fsdp_cfg.compile is not None:
        return fsdp_cfg.compile
    return device == "cuda" and dense_text and fsdp_cfg.ulysses_size == 1


def prepare_layers(module: torch.nn.Module, fsdp_cfg: DictConfig, device: str, vision: bool,
                   layer_classes: set[str]) -> str:
    """Compile ``module``'s decoder layers where :func:`compiles` says so; returns the output layer's head."""
    head = token_head_of(fsdp_cfg, device)
    if head == "liger" and vision:
        raise ConfigError("token_head=liger cannot leave a vision-language model's vision tokens out of the "
                          "softmax (rlplat.models.vision): use token_head=fused or chunked")
    moe = is_moe(module.config)
    if fsdp_cfg.compile and moe:
        raise ConfigError(f"compile=true: compiled layers are not supported for a mixture of experts yet "
                          f"({type(module).__name__}: its routing is recorded and replayed per layer)")
    # auto (None) leaves a model that names no decoder layer class eager; compile=true refuses it
    if compiles(fsdp_cfg, device, dense_text=not moe and not vision) and (layer_classes or fsdp_cfg.compile):
        compile_layers(module, layer_classes)
    return head


#: the compiled layers' activation memory budget (torch's ``activation_memory_budget``: 1 = keep everything)
COMPILED_ACTIVATION_BUDGET = 0.95


def compile_layers(module: torch.nn.Module, layer_classes: set[str]) -> int:
    """Regional compilation (``<role>.fsdp.compile``): each decoder layer (a module whose class is named in
    ``layer_classes``) compiled by ``torch.compile`` on its own, in place, so that its parameters keep their
    names, FSDP2's per-layer hooks stay outside the compiled code, and the layers, all alike, share one
    compiled program (PyTorch's regional compilation recipe). Returns how many layers."""
    layers = [sub for sub in module.modules() if type(sub).__name__ in layer_classes]
    if not layers:
        raise ConfigError(f"compile=true: {type(module).__name__} names no decoder layer class "
                          f"(_no_split_modules), so there is nothing to compile layer by layer")
    # Left alone, the compiler's partitioner keeps whatever saves recomputation for the backward pass, more
    # than eager autograd keeps (the gated MLP's product too: rlplat.engines.gated_mlp); a budget just under
    # all of it makes it recompute the cheap elementwise results instead (less kept than eager at 0.5B:
    # docs/gpu.md). The setting is the process's, read when a layer is first compiled.
    from torch._functorch import config as functorch_config

    functorch_config.activation_memory_budget = COMPILED_ACTIVATION_BUDGET
    for layer in layers:
        layer.compile()
    return len(layers)


@TRAINING_ENGINES.register("fsdp")
class FSDPEngine(TrainingEngine):
    """One model sharded with FSDP2 over the worker group's data-parallel mesh (on one worker without
    mixed precision or offloading, the plain module: there is nothing to shard).

    ``optim_cfg=None`` builds a frozen engine (the reference policy): no optimizer, no gradients.
    """

    checkpoints_hf_names = True
    trains_experts = True
    trains_vision = True

    # the plan's memory declarations (the defaults: rlplat.engines.memory)
    @classmethod
    def memory_layout(cls, section, world, replicas):
        """Weights, gradients and AdamW's state sharded over every worker; sequences over Ulysses' ranks."""
        return MemoryLayout(shard=world, optimizer_shard=world, replicas=replicas, sp=section.ulysses_size)

    @classmethod
    def memory_state(cls, shape, cfg, role, lay, compute_bytes, trained):
        """Nothing on the device with ``param_offload``; with bf16 compute, the bf16 copies FSDP gathers (one
        layer at a time plus the next one it prefetches, or every layer when ``reshard_after_forward=false``)."""
        section = cfg[role].fsdp
        parts = model_state(shape, cfg, role, lay, trained, offloaded=section.param_offload)
        if compute_bytes < 4:
            gathered = shape.params if not section.reshard_after_forward else 2 * shape.layer_params
            parts[f"{role} bf16 compute copies"] = compute_bytes * gathered
        return parts

    @classmethod
    def keeps_gradients(cls, cfg, role, lay, compute_bytes):
        """A one-worker float32 module keeps them in one buffer for the whole run (FSDP frees them after a step)."""
        return lay.shard == 1 and compute_bytes == 4 and not cfg[role].fsdp.param_offload

    @classmethod
    def describe(cls, engine_cfg, device, shape) -> str:
        dense_text = not shape.experts and not shape.vision_params
        return (f"{token_head_of(engine_cfg, device)} token head, "
                f"{'compiled' if compiles(engine_cfg, device, dense_text) else 'eager'} layers")

    @classmethod
    def lends_weights(cls, cfg, role, lay):
        """One worker holding the plain module, not offloaded, without LoRA's merged weights."""
        return lay.shard == 1 and not cfg[role].fsdp.param_offload and not (role == "actor" and cfg.model.lora.rank)

    @classmethod
    def check_config(cls, cfg, role, world_size, device):
        super().check_config(cfg, role, world_size, device)
        engine_cfg, key = cfg[role].fsdp, f"{role}.fsdp"
        check_mixed_precision(engine_cfg.mixed_precision, f"{key}.mixed_precision", device,
                              "on CPU the FSDP engine computes in float32 (auto or none)")
        if engine_cfg.param_offload and device != "cuda":
            raise ConfigError(f"{key}.param_offload needs a GPU (trainer.device resolved to {device})")
        sp = engine_cfg.ulysses_size
        if sp > 1 and world_size % sp:
            raise ConfigError(f"{key}.ulysses_size={sp} splits each sequence over {sp} workers, and must divide the "
                              f"{world_size} workers the {role} runs on")
        check_token_head(engine_cfg, key, device)
        if engine_cfg.compile and sp > 1:  # None (auto) leaves them eager there
            raise ConfigError(f"{key}.compile=true with {key}.ulysses_size={sp}: compiled layers are not supported "
                              f"with Ulysses' all-to-all inside the attention yet (set one of them back)")
        if sp > 1 and (known := known_config(model_of(cfg, role))) is not None:
            check_ulysses(known, sp, key, model_of(cfg, role).path)
        actor_sp = cfg.actor.fsdp.ulysses_size if cfg.actor.strategy == "fsdp" else 1
        if role in ("ref", "teacher") and cfg[role].placement == "colocated" and sp not in (1, actor_sp):
            raise ConfigError(f"{key}.ulysses_size={sp}: a colocated {role.replace('ref', 'reference')} splits its "
                              f"sequences over the actor's groups (actor.fsdp.ulysses_size={actor_sp}) or none (1)")

    def __init__(
        self,
        model_path: str,
        model_cfg: DictConfig,
        fsdp_cfg: DictConfig,
        dist_ctx: DistContext,
        optim_cfg: DictConfig | None = None,
        total_optimizer_steps: int = 1,
        value_head: bool = False,
        lora: DictConfig | None = None,
        seed: int = 0,
        moe: DictConfig | None = None,
        vision: DictConfig | None = None,
    ):
        self.ctx, self.value_head = dist_ctx, value_head
        module = load_hf_model(model_path, model_cfg, value_head)
        self._split_sequences(module, fsdp_cfg.ulysses_size, model_path)
        # LoRA adapters (model.lora, the actor only; initialised from ``seed`` alike on every rank): the scaling
        # of each adapted layer by its name
        scalings = inject_lora(module, lora, seed) if lora is not None and lora.rank else None
        if model_cfg.gradient_checkpointing and optim_cfg is not None:
            module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            module.train()  # transformers recomputes only in training mode ...
            _without_dropout(module)  # ... whose dropout stays off: updates see the log-probs the rollout had
        if optim_cfg is None:
            module.requires_grad_(False)
        self._see(module, vision if optim_cfg is not None else None)
        install_gated_mlp(module)  # keeps half of the MLP's activations for the backward pass
        # a mixture of experts (``moe``: actor.moe): the routing its forwards replay and record (rlplat.engines.routing)
        tap = RouterTap.of(module, moe) if moe is not None else None
        self.routing = RoutedForward(tap, moe.router_replay, optim_cfg is not None) if tap is not None else None
        self.vocab_size = module.config.get_text_config().vocab_size
        # log-prob, entropy and sum pi^2 computed in chunks from the last hidden states, without full logits
        self.chunked_head = not value_head and TokenOutputLM.fits(module)
        layer_classes = set(getattr(module, "_no_split_modules", None) or ())
        head = prepare_layers(module, fsdp_cfg, self.ctx.device.type, self.vision, layer_classes)
        self._model = self._shard(TokenOutputLM(module, head) if self.chunked_head else module, fsdp_cfg,
                                  layer_classes)
        if scalings is not None:
            self.lora = LoRA(self._model, lora, scalings, lambda bucket, dtype: gather_bucket(bucket, dtype, self.ctx))
        self.optim = Optimizer(self._model.parameters(), optim_cfg, total_optimizer_steps,
                               flat_state=True) if optim_cfg else None
        self.pack_sequences = fsdp_cfg.pack_sequences and self._packing_matches_padding()
        if fsdp_cfg.pack_sequences and not self.pack_sequences and dist_ctx.rank == 0:
            print(f"[engine] {type(module).__name__} scores packed sequences differently from padded ones "
                  f"(its attention ignores restarting position ids): running with padding; set "
                  f"<role>.fsdp.pack_sequences=false to skip this check", flush=True)
        self.packing_efficiency()  # the check's tokens are not the run's

    def _split_sequences(self, module: torch.nn.Module, sp_size: int, model_path: str) -> None:
        """Ulysses sequence parallelism (fsdp.ulysses_size): each replica is a group of ``sp_size`` consecutive
        ranks that run one micro-batch, each on a slice of its sequences."""
        self.sp_size, self.sp_group, self.dp_group = sp_size, None, None
        self._sequence_shard: SequenceShard | None = None  # the last forward's, for a backward that recomputes it
        if sp_size > 1:
            check_ulysses(module.config, sp_size, "fsdp", model_path)  # a hub id's config is first read here
            register_ulysses()
            module.set_attn_implementation(ULYSSES)
            self.dp_group, self.sp_group = self.ctx.replica_groups(sp_size)

    def _see(self, module: torch.nn.Module, trained_vision: DictConfig | None) -> None:
        """A vision-language model's tokens that its responses never hold, out of its policy's softmax
        (rlplat.models.vision), and its vision tower frozen when trained with ``actor.vision.freeze``."""
        self.vision = is_vision(module.config)
        self.vision_tokens = torch.tensor(vision_token_ids(module.config), device=self.ctx.device) \
            if self.vision else None
        if self.vision and trained_vision is not None and trained_vision.freeze:
            self.frozen_names = frozenset(vision_parameters(module))
            for name, param in module.named_parameters():
                if name in self.frozen_names:
                    param.requires_grad_(False)

    def _shard(self, module: torch.nn.Module, fsdp_cfg: DictConfig, layer_classes: set[str]) -> torch.nn.Module:
        """``module`` as the root of FSDP2, each submodule whose class is named in ``layer_classes`` (the
        decoder layers) sharded on its own."""
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        on_gpu = self.ctx.device.type == "cuda"
        kwargs = {"mesh": self.ctx.mesh(), "reshard_after_forward": fsdp_cfg.reshard_after_forward}
        self.compute_dtype = getattr(torch, self.computes_in(fsdp_cfg, self.ctx.device.type))
        if self.compute_dtype == torch.bfloat16:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        self.offloaded = on_gpu and fsdp_cfg.param_offload
        if self.offloaded:
            kwargs["offload_policy"] = CPUOffloadPolicy()
        else:
            module.to(self.ctx.device)
        if self.ctx.world_size == 1 and "mp_policy" not in kwargs and not self.offloaded:
            return module  # nothing to shard, cast or offload: FSDP's hooks would only cost time (docs/performance.md)
        # Shard each decoder layer on its own so only one layer's full weights exist at a time.
        for sub in module.modules():
            if type(sub).__name__ in layer_classes:
                fully_shard(sub, **kwargs)
        fully_shard(module, **kwargs)
        return module

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    def forward(self, micro: Batch, *, temperature=1.0, need_entropy=False, need_sum_pi_squared=False,
                grad=False):
        t = micro.tensors
        rows = PackedBatch.build(t["input_ids"], t["attention_mask"], t["responses"]) if self.pack_sequences else None
        masked = rows is None  # padded rows need the attention mask; packed ones carry it in their positions
        if masked:
            rows = PackedBatch.padded(t["input_ids"], t["attention_mask"], t["position_ids"], t["responses"])
        self.tokens_real += rows.real_tokens
        self.tokens_computed += rows.input_ids.numel()
        device = self.ctx.device
        inputs = {"input_ids": rows.input_ids.to(device), "position_ids": rows.position_ids.to(device),
                  "attention_mask": t["attention_mask"].to(device) if masked else None}
        if self.vision:
            inputs.update(self._vision_inputs(micro, rows, masked))
        positions, targets = rows.flat_index.to(device), rows.targets.to(device)
        shard, combine = contextlib.nullcontext(), lambda values: values
        if self.sp_group is not None:  # this rank's slice of the rows; the outputs combined over the group
            local = split_rows(inputs["input_ids"], inputs["position_ids"], inputs["attention_mask"], positions,
                               self.sp_group)
            inputs = {"input_ids": local.input_ids, "position_ids": local.position_ids, "attention_mask": None}
            positions, targets, combine = local.positions, targets[local.held], local.combine
            shard = sharded(local.shard)
            self._sequence_shard = local.shard if grad else None

        def outs(*values: torch.Tensor) -> list[torch.Tensor]:  # each [N] -> [B, R], combined in one collective
            return [rows.scatter(v) for v in combine(torch.stack(values, -1)).unbind(-1)]

        routes = self.routing.around(rows, t, grad, self.sp_group) if self.routing else contextlib.nullcontext()
        with torch.set_grad_enabled(grad), shard, routes as routing:
            if self.chunked_head:
                log_prob, entropy, sum_sq = self._model(
                    **inputs, positions=positions, targets=targets, temperature=temperature,
                    need_entropy=need_entropy, need_sum_pi_squared=need_sum_pi_squared)
            elif self.value_head:
                values = self._model(**inputs, use_cache=False).logits.reshape(-1)[positions]
                return ForwardOutput(values=outs(values.float())[0])
            else:
                from rlplat.algorithms import entropy_from_logits

                logits = self._model(**inputs, use_cache=False).logits
                logits = logits.reshape(-1, logits.shape[-1])[positions]
                if self.vision_tokens is not None:  # a VLM's policy never emits them (rlplat.models.vision)
                    logits = without_vision_tokens(logits, self.vision_tokens)
                log_prob, scaled = response_log_probs(logits, targets, temperature)
                entropy = entropy_from_logits(scaled) if need_entropy else None
                sum_sq = torch.softmax(scaled, dim=-1).square().sum(-1) if need_sum_pi_squared else None
            got = outs(log_prob, *([entropy] if need_entropy else []), *([sum_sq] if need_sum_pi_squared else []))
        out = ForwardOutput(log_probs=got[0], entropy=got[1] if need_entropy else None,
                            sum_pi_squared=got[-1] if need_sum_pi_squared else None)
        if routing is not None:
            self.routing.finish(out, routing, rows, t, grad, self.sp_group)
        return out

    def _vision_inputs(self, micro: Batch, rows: PackedBatch, masked: bool) -> dict[str, torch.Tensor]:
        """A vision-language model's inputs for ``rows``: every token's 3-D rotary position (in packed rows with
        each sequence's token indices first, which keep the sequences apart) and the images of the rows in the
        order their tokens come."""
        t, device = micro.tensors, self.ctx.device
        multi_modal = micro.non_tensors.get(MULTI_MODAL)
        prompt_width = t["input_ids"].shape[1] - t["responses"].shape[1]
        positions = rope_positions(self._model, t["input_ids"], t["attention_mask"], multi_modal, prompt_width)
        if masked:
            spatial = model_positions(positions)
        else:
            spatial = model_positions(rows.pack(positions).view(*rows.input_ids.shape, 3), rows.position_ids)
        return {"position_ids": spatial.to(device), **image_inputs(multi_modal, rows.sequence_order(), device)}

    def own_routing(self):
        return self.routing.own_routing() if self.routing is not None else contextlib.nullcontext()

    def _packing_matches_padding(self) -> bool:
        """Whether this model, given packed rows, scores each sequence as it does alone (see
        :mod:`rlplat.engines.packing`): one long and two short sequences, once padded and once packed
        (the short ones share a row)."""
        ids = torch.tensor([[1, 2, 3, 4, 5, 6, 0], [0, 0, 7, 8, 9, 0, 0], [0, 0, 10, 11, 12, 0, 0]]) % self.vocab_size
        mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0, 0]])
        micro = Batch.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids_from_mask(mask),
                                 "responses": ids[:, 4:]})
        with self.own_routing():
            self.pack_sequences = True
            packed = self.forward(micro)
            self.pack_sequences = False
            padded = self.forward(micro)
        scores = "values" if self.value_head else "log_probs"
        real = mask[:, 4:].bool()
        gap = (getattr(packed, scores)[real] - getattr(padded, scores)[real]).abs().max().item()
        return gap <= (1e-4 if self.compute_dtype == torch.float32 else 5e-2)  # a leak between sequences is larger

    @property
    def layout(self) -> ParallelLayout:
        # every rank is a replica; with Ulysses, every group of sp_size ranks (its first rank answers)
        return ParallelLayout(dp_rank=self.ctx.rank // self.sp_size, dp_size=self.ctx.world_size // self.sp_size,
                              collects=self.ctx.rank % self.sp_size == 0)

    def all_reduce_dp(self, values: list[float], op: str = "sum") -> list[float]:
        return self.ctx.all_reduce(values, op, group=self.dp_group)

    def backward(self, loss: torch.Tensor) -> None:
        # FSDP averages gradients over the ranks; the losses are normalised by global denominators and
        # must be summed over the replicas instead. With Ulysses every rank of a replica computes the replica's
        # loss, and the outputs' combination sums its ranks' gradients (ulysses.LocalRows.combine): the replica
        # size is already in them.
        with sharded(self._sequence_shard) if self._sequence_shard is not None else contextlib.nullcontext():
            (loss * (self.ctx.world_size // self.sp_size)).backward()

    def _state_options(self):
        """With LoRA a checkpoint holds the adapters (and their optimizer state), not the frozen base weights,
        which the model path gives again (so loading is not strict about them: :meth:`load_checkpoint` checks
        the adapters itself)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        lora = self.lora is not None
        return StateDictOptions(ignore_frozen_params=lora, strict=not lora)

    def save_checkpoint(self, path: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self._model, [self.optim.optimizer] if self.optim else [],
                                                  options=self._state_options())
        state = {"model": self._trained_only(model_state), "optim": optim_state}
        if (reference := self._reference_adapters()) is not None:  # a synced reference's (ref.sync_steps with LoRA)
            state["reference_adapters"] = reference
        dcp.save(state, checkpoint_id=path)
        save_rank_state(path, self.ctx.rank, self.optim)

    def load_checkpoint(self, path: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        optimizers = [self.optim.optimizer] if self.optim else []
        options = self._state_options()
        model_state, optim_state = get_state_dict(self._model, optimizers, options=options)
        state = {"model": self._trained_only(model_state), "optim": optim_state}
        if (reference := self._reference_adapters()) is not None:
            state["reference_adapters"] = reference  # loaded in place
        dcp.load(state, checkpoint_id=path)
        loaded = set_state_dict(self._model, optimizers, model_state_dict=state["model"],
                                optim_state_dict=state["optim"], options=options)
        trained = {name for name, p in self._model.named_parameters() if p.requires_grad}
        if missing := sorted(trained & set(loaded.missing_keys)):
            raise RuntimeError(f"{path}: the checkpoint has no {missing[0]!r} ({len(missing)} trained weights missing)")
        load_rank_state(path, self.ctx.rank, self.optim)

    def _reference_adapters(self) -> dict[str, torch.Tensor] | None:
        return self.lora.reference_adapters if self.lora is not None else None

    def _trained_only(self, model_state: dict) -> dict:
        """With LoRA, the adapters' entries alone (a frozen weight tied to another, the output layer tied to the
        embedding, is kept by torch's ``ignore_frozen_params``)."""
        if self.lora is None:
            return model_state
        frozen = {name for name, p in self._model.named_parameters(remove_duplicate=False) if not p.requires_grad}
        return {name: value for name, value in model_state.items() if name not in frozen}

    def live_weights(self):
        from torch.distributed.tensor import DTensor

        if self.ctx.world_size != 1 or self.offloaded or self.lora is not None:
            return None  # sharded (or offloaded to the host, or LoRA's merged weights): only copies are whole
        return {name: tensor.to_local() if isinstance(tensor, DTensor) else tensor
                for name, tensor in self._model.state_dict(keep_vars=True).items()}

    def export_weights(self, dtype=None, bucket_bytes=512 * 2**20):
        for bucket in self._buckets(dtype, bucket_bytes):
            yield self._gathered(bucket, dtype)

    def _buckets(self, dtype, bucket_bytes):
        """The state dict's (name, local tensor) pairs in buckets of about ``bucket_bytes`` (in ``dtype``); an
        adapted layer's base weight and adapters stay in one bucket (they are merged there)."""
        group_of = owner if self.lora is not None else (lambda name: None)
        return bucketed(list(self._model.state_dict().items()), dtype, bucket_bytes, group_of)

    def _gathered(self, bucket, dtype):
        """A bucket's full tensors in ``dtype``; with LoRA under Hugging Face names, merged (gathered in float32)."""
        if self.lora is None:
            return gather_bucket(bucket, dtype, self.ctx)
        return self.lora.merge(gather_bucket(bucket, None, self.ctx), dtype)

    def blend_weights(self, buckets, alpha):
        if self.lora is not None:
            raise TypeError("blend_weights: an engine with LoRA adapters is the reference with its adapters off")
        blend_shards(self._model.state_dict(), buckets, alpha, self.ctx)


def check_ulysses(config, sp: int, key: str, path: str) -> None:
    """``sp`` (``<key>.ulysses_size``) divides ``config``'s attention heads, and the model is one whose
    sequences Ulysses splits: not yet a vision-language model's images."""
    if is_vision(config):
        raise ConfigError(f"{key}.ulysses_size={sp}: Ulysses sequence parallelism does not split an image's tokens "
                          f"({path} is a vision-language model) yet; set {key}.ulysses_size=1")
    check_heads(config.num_attention_heads, sp, f"{key}.ulysses_size")


def _without_dropout(module: torch.nn.Module) -> None:
    """Dropout off in training mode as in eval mode (rlplat trains without dropout, as verl does)."""
    for sub in module.modules():
        if isinstance(sub, torch.nn.Dropout):
            sub.p = 0.0
        if isinstance(getattr(sub, "attention_dropout", None), float):  # attention's functional dropout
            sub.attention_dropout = 0.0


def blend_shards(params: dict[str, torch.Tensor], buckets, alpha: float, ctx: DistContext) -> None:
    """Blend the full tensors of ``buckets`` into ``params`` (a state dict: name -> this rank's ``Shard(0)``
    piece, tied weights sharing one) in place: each rank its own rows, a tied weight once."""
    from torch.distributed.tensor import DTensor, Shard

    given, blended = set(), set()
    with torch.no_grad():
        for bucket in buckets:
            for name, full in bucket:
                given.add(name)
                target = params.get(name)
                if target is None:
                    continue  # reported by check_blended
                local = target.to_local() if isinstance(target, DTensor) else target
                if local.numel() and local.data_ptr() in blended:
                    continue  # a tied weight (lm_head = embed_tokens), already blended once
                blended.add(local.data_ptr())
                piece = full.to(local.device)
                if isinstance(target, DTensor) and target.placements == (Shard(0),):
                    rows = _dim0_shard_sizes(full.shape[0], ctx.world_size)
                    start = sum(rows[: ctx.rank])
                    piece = piece[start : start + rows[ctx.rank]]
                blend_(local, piece, alpha)
    check_blended(given, params)


def _dim0_shard_sizes(dim0: int, world: int) -> list[int]:
    """Rows of each rank's ``Shard(0)`` piece: ``torch.chunk`` sizes, then empty pieces."""
    step = -(-dim0 // world)  # ceil
    return [max(0, min(step, dim0 - r * step)) for r in range(world)]


def gather_bucket(items: list[tuple[str, torch.Tensor]], dtype: torch.dtype | None, ctx: DistContext):
    """Full tensors of a bucket of FSDP2 ``Shard(0)`` DTensors with ONE all-gather: each rank packs its
    local pieces (cast to ``dtype`` first, so half the bytes travel in bf16) into one flat buffer; the
    piece sizes on every rank follow from the global shapes, so they need no communication."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=ctx.device, dtype=dtype or t.dtype)

    sharded = [isinstance(t, DTensor) and t.placements == (Shard(0),) for _, t in items]
    out = {name: cast(t.full_tensor() if isinstance(t, DTensor) else t)
           for (name, t), s in zip(items, sharded) if not s or ctx.world_size == 1}
    todo = [(name, t) for (name, t), s in zip(items, sharded) if s and ctx.world_size > 1]
    if todo:
        world = ctx.world_size
        out_dtype = dtype or todo[0][1].dtype
        if any((dtype or t.dtype) != out_dtype for _, t in todo):
            raise ValueError("gather_bucket: a bucket of mixed dtypes needs an explicit dtype")
        sizes = [[rows * math.prod(t.shape[1:]) for rows in _dim0_shard_sizes(t.shape[0], world)]
                 for _, t in todo]  # sizes[param][rank], in elements
        width = max(sum(s[r] for s in sizes) for r in range(world))
        local = torch.cat([cast(t.to_local()).reshape(-1) for _, t in todo])
        if local.numel() != sum(s[ctx.rank] for s in sizes):
            raise RuntimeError("FSDP shard layout is not torch.chunk along dim 0; cannot unpack the gathered weights")
        buffer = torch.zeros(width, dtype=out_dtype, device=ctx.device)
        buffer[: local.numel()] = local
        gathered = [torch.empty_like(buffer) for _ in range(world)]
        dist.all_gather(gathered, buffer)
        offsets = [0] * world
        for (name, t), per_rank in zip(todo, sizes):
            pieces = []
            for r in range(world):
                pieces.append(gathered[r][offsets[r] : offsets[r] + per_rank[r]])
                offsets[r] += per_rank[r]
            out[name] = torch.cat(pieces).view(t.shape)
    return [(name, out[name]) for name, _ in items]
