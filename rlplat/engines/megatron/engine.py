"""Megatron-Core training engine (``<role>.strategy=megatron``): a ``GPTModel`` split over
``tensor_model_parallel_size`` workers, replicated over the rest (data parallel).

Weights come from the Hugging Face checkpoint (:mod:`rlplat.engines.megatron.convert`) and leave in
Hugging Face names, so the rollout engines and the export see the same weights as with FSDP. Log-probs,
entropy and ``sum_pi_squared`` are computed on vocabulary-parallel logits without gathering them (one
all-reduce of the max, of the normaliser and of the picked logit per position). Gradients are summed over
the data-parallel group (the losses are normalised by global denominators) and clipped by the global norm
over the tensor- and pipeline-parallel shards.

With ``pipeline_model_parallel_size`` > 1 each worker of a replica holds a stage of layers; micro-batches
run through Megatron-Core's own schedule (1F1B; its ``get_forward_backward_func``), which calls rlplat's
loss on the last stage. Every stage returns the last stage's results (broadcast over the pipeline group),
so the roles see the same answers at any pp. A critic is the same backbone with a one-output head.

Options (``<role>.megatron.*``): sequence parallelism, activation recomputation, the optimizer sharded over
the data-parallel replicas (:mod:`rlplat.engines.optim`), bf16 compute on a GPU, bf16 weights stepped
through fp32 master copies (``params_dtype=bf16``). Checkpoints are
torch.distributed.checkpoint directories of Hugging Face-named slices, so they load into any parallel
layout (:mod:`rlplat.engines.megatron.checkpoint`). docs/megatron.md has the whole picture.

On CPU (tests, small runs) Megatron-Core's CUDA-only calls are pointed at the CPU for the length of each
of the engine's calls into it (:mod:`rlplat.engines.megatron.cpu`, entered by :func:`_runs_megatron`),
and only for a megatron-core release that module was written for.
"""

from __future__ import annotations

import contextlib
import functools
import re

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from rlplat.config.derive import model_of
from rlplat.config.errors import ConfigError
from rlplat.engines.base import (ForwardOutput, ParallelLayout, TrainingEngine, add_metrics, check_mixed_precision,
                                 load_rank_state, micro_batches, save_rank_state)
from rlplat.engines.dist import REDUCE_OPS, DistContext
from rlplat.engines.megatron import cpu, memory
from rlplat.engines.megatron.checkpoint import checkpoint_state, load_checkpoint_state, masters_here
from rlplat.engines.megatron.convert import LOCAL_EXPERT, GPTShape, data_parallel_size, megatron_name
from rlplat.engines.megatron.routing import CountedRouting, MegatronRouterTap, SequenceFirstRows
from rlplat.engines.megatron.shards import RankShards
from rlplat.engines.megatron.model import build_gpt_model, no_grad_at
from rlplat.engines.megatron.vocab_parallel import mask_vocab_padding, vocab_parallel_outputs
from rlplat.engines.optim import Optimizer
from rlplat.engines.routing import RoutedForward
from rlplat.models.moe import is_moe
from rlplat.models.vision import is_vision
from rlplat.protocol import Batch

PARAMS_DTYPES = ("fp32", "bf16")  # <role>.megatron.params_dtype
MOE_MODELS = ("qwen3_moe",)  # the mixtures of experts it converts (rlplat.engines.megatron.convert)


def model_shape(model_cfg) -> GPTShape | None:
    """The architecture of ``model.path`` when it is known without downloading (a local directory or the
    embedded model); None for a hub id."""
    from rlplat.models.embedded import known_config

    config = known_config(model_cfg)
    return None if config is None else GPTShape.from_hf_config(config)


def _hf_weights(model_path: str, model_cfg, value_head: bool, device: torch.device) -> tuple[dict, int | None]:
    """The Hugging Face model's weights (fp32, CPU) and its pad token id. A value model's fresh head draws from
    the seeded generator as the FSDP engine's does, and every worker takes rank 0's (the replicas and shards
    must hold one head)."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    auto = AutoModelForTokenClassification if value_head else AutoModelForCausalLM
    hf_model = auto.from_pretrained(model_path, dtype=torch.float32, trust_remote_code=model_cfg.trust_remote_code,
                                    **({"num_labels": 1} if value_head else {}))
    hf = hf_model.state_dict()
    for name in ("score.weight", "score.bias") if value_head else ():
        head = hf[name].to(device)
        dist.broadcast(head, src=0)
        hf[name] = head.cpu()
    return hf, hf_model.get_input_embeddings().padding_idx


def _init_parallel_state(tp: int, pp: int, ep: int, device: torch.device, seed: int) -> None:
    """The model-parallel groups; a mixture of experts' experts fold over the tensor- and data-parallel ranks of a
    stage, each expert whole on its rank (expert tensor parallel size 1)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if parallel_state.model_parallel_is_initialized():
        sizes = (parallel_state.get_tensor_model_parallel_world_size(),
                 parallel_state.get_pipeline_model_parallel_world_size(),
                 parallel_state.get_expert_model_parallel_world_size())
        if sizes != (tp, pp, ep):
            raise RuntimeError("two Megatron engines in one worker need the same tensor, pipeline and expert parallel "
                               "sizes")
        return
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                             expert_model_parallel_size=ep, expert_tensor_parallel_size=1)
    if device.type == "cuda":
        model_parallel_cuda_manual_seed(seed)


def _check_trains(hf_config, model_path: str) -> None:
    """The Megatron engine trains dense text models and Qwen3-MoE mixtures of experts, not a vision-language
    model."""
    if is_moe(hf_config) and getattr(hf_config, "model_type", None) not in MOE_MODELS:
        raise ValueError(f"{model_path} is a mixture of experts of type {hf_config.model_type!r}; the Megatron engine "
                         f"trains {', '.join(MOE_MODELS)} (docs/moe.md): use <role>.strategy=fsdp")
    if is_vision(hf_config):
        raise ValueError(f"{model_path} is a vision-language model, which the Megatron engine does not train; "
                         f"use <role>.strategy=fsdp (docs/vision.md)")


def _check_experts(shape: GPTShape, engine_cfg) -> None:
    """What a mixture of experts runs with on this engine (ValueError in one line): sequence parallelism with tensor
    parallelism (Megatron-Core's MoE layers require it in training)."""
    tp = engine_cfg.tensor_model_parallel_size
    if shape.num_experts and tp > 1 and not engine_cfg.sequence_parallel:
        raise ValueError(f"tensor_model_parallel_size={tp} with a mixture of experts needs sequence_parallel=true "
                         f"(Megatron-Core's MoE layers train tensor-parallel only with it)")


def _check_section(cfg, role: str, world_size: int, device: str) -> None:
    """The engine's own start-up checks of ``<role>.megatron`` (:meth:`MegatronEngine.check_config`)."""
    engine_cfg, key = cfg[role].megatron, f"{role}.megatron"
    if role == "actor" and cfg.model.lora.rank:
        raise ConfigError(f"model.lora.rank={cfg.model.lora.rank}: LoRA is not supported on the Megatron engine "
                          f"yet; use actor.strategy=fsdp")
    tp, pp = engine_cfg.tensor_model_parallel_size, engine_cfg.pipeline_model_parallel_size
    shape = model_shape(model_of(cfg, role))
    try:  # for a hub id the model's side is checked when it loads
        data_parallel_size(world_size, tp, pp, shape, engine_cfg.expert_model_parallel_size)
        if shape is not None:
            _check_experts(shape, engine_cfg)
    except ValueError as err:
        raise ConfigError(f"{key}: {err}") from None
    ep = engine_cfg.expert_model_parallel_size
    budgets = [k for k in ("micro_batch_max_tokens_per_worker", "log_prob_micro_batch_max_tokens_per_worker")
               if cfg[role].get(k)]
    if budgets and ep > 1 and device != "cuda" and shape is not None and shape.num_experts:
        raise ConfigError(f"{role}.{budgets[0]}={cfg[role][budgets[0]]} with {key}.expert_model_parallel_size={ep} on "
                          f"{device}: the experts' tokens are all-gathered over the expert-parallel ranks there, which "
                          f"takes micro-batches of one shape on every rank; count sequences instead (the "
                          f"*_size_seqs_per_worker keys; a GPU's all-to-all takes any)")
    check_mixed_precision(engine_cfg.mixed_precision, f"{key}.mixed_precision", device,
                          "Megatron-Core's layers compute in bf16 only under CUDA autocast")
    if engine_cfg.params_dtype not in PARAMS_DTYPES:
        raise ConfigError(f"{key}.params_dtype={engine_cfg.params_dtype!r} is not one of: "
                          f"{', '.join(PARAMS_DTYPES)}")
    if role == "ref" and engine_cfg.params_dtype == "bf16" and cfg.ref.sync_steps > 0 and cfg.ref.sync_alpha < 1:
        raise ConfigError(f"{key}.params_dtype=bf16 with ref.sync_alpha={cfg.ref.sync_alpha} < 1: mixing a small "
                          f"share of the actor into bf16 weights rounds most of it away; set {key}.params_dtype="
                          f"fp32 (the reference then keeps fp32 weights)")
    if engine_cfg.params_dtype == "bf16" and engine_cfg.mixed_precision == "none":
        raise ConfigError(f"{key}.params_dtype=bf16 computes in bf16, and {key}.mixed_precision=none asks for "
                          f"fp32 compute; set one of them differently")
    if engine_cfg.sequence_parallel and tp == 1:
        raise ConfigError(f"{key}.sequence_parallel=true needs {key}.tensor_model_parallel_size > 1 (the "
                          f"sequence is split over the tensor-parallel ranks)")
    if device != "cuda":
        try:
            cpu.check_version()
        except RuntimeError as err:
            raise ConfigError(f"{role}.strategy=megatron on {device}: {err}") from None


def _build_model(hf_config, engine_cfg, params_dtype: torch.dtype, first_stage: bool, last_stage: bool,
                 value_head: bool, device: torch.device) -> torch.nn.Module:
    """This rank's shard of the ``GPTModel``, randomly initialised (:func:`build_gpt_model` with the section's
    parallel sizes and switches)."""
    recompute = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1} \
        if engine_cfg.recompute_activations else {}
    # a mixture of experts' tokens reach them all-to-all on a GPU, all-gathered on CPU (all-to-all needs CUDA streams)
    dispatch = {"moe_token_dispatcher_type": "alltoall" if device.type == "cuda" else "allgather"} \
        if is_moe(hf_config) else {}
    with cpu.building() if device.type == "cpu" else contextlib.nullcontext():
        return build_gpt_model(  # the losses carry the global denominators: the schedule must not rescale them
            hf_config, params_dtype, pre_process=first_stage, post_process=last_stage, value_head=value_head,
            tensor_model_parallel_size=engine_cfg.tensor_model_parallel_size,
            pipeline_model_parallel_size=engine_cfg.pipeline_model_parallel_size,
            expert_model_parallel_size=engine_cfg.expert_model_parallel_size, calculate_per_token_loss=True,
            sequence_parallel=engine_cfg.sequence_parallel, **recompute, **dispatch)


def _copy_masters(masters: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]) -> None:
    """Start the optimizer's fp32 master weights from the checkpoint's fp32 ``weights`` (not the bf16 copies)."""
    with torch.no_grad():
        for name, master in masters.items():
            master.copy_(weights[name])


def _no_loss(logits: torch.Tensor, micro: Batch):
    """A forward-only pass's per-micro-batch: no loss, no result (the pass is for what the stages routed)."""
    return logits.new_zeros(()), None


def _runs_megatron(method):
    """``method`` calls into Megatron-Core: on CPU it runs with Megatron-Core's CUDA-only calls redirected
    (:data:`rlplat.engines.megatron.cpu.redirected`), and they are restored when it returns."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._megatron_context():
            return method(self, *args, **kwargs)

    return run


class MegatronEngine(TrainingEngine):
    """One Megatron-Core ``GPTModel``; ``optim_cfg=None`` builds a frozen engine (the reference policy)."""

    checkpoints_hf_names = True  # its checkpoints name every tensor as Hugging Face does (docs/megatron.md)
    trains_experts = True  # Qwen3-MoE, with expert parallelism and routing replay (docs/moe.md)
    update_knob = ("actor.megatron.recompute_activations=true, a larger tensor/pipeline parallel size or a smaller "
                   "micro-batch")

    # the plan's memory declarations (rlplat.engines.megatron.memory)
    @classmethod
    def memory_layout(cls, section, world, replicas):
        return memory.layout(section, replicas)

    @classmethod
    def memory_state(cls, shape, cfg, role, lay, compute_bytes, trained):
        return memory.state(shape, cfg, role, lay, trained)

    @classmethod
    def memory_activations(cls, shape, cfg, role, lay, tokens, response_tokens, compute_bytes, grad, seq):
        return memory.activations(shape, cfg, lay, tokens, response_tokens, compute_bytes, grad, seq)

    @classmethod
    def check_config(cls, cfg, role, world_size, device):
        super().check_config(cfg, role, world_size, device)
        _check_section(cfg, role, world_size, device)

    @classmethod
    def computes_in(cls, engine_cfg, device: str) -> str:
        """bf16 weights compute in bf16 on any device; otherwise as :meth:`TrainingEngine.computes_in`."""
        if engine_cfg.get("params_dtype") == "bf16":
            return "bfloat16"
        return super().computes_in(engine_cfg, device)

    def __init__(self, model_path: str, model_cfg: DictConfig, engine_cfg: DictConfig, dist_ctx: DistContext,
                 optim_cfg: DictConfig | None = None, total_optimizer_steps: int = 1, value_head: bool = False,
                 moe: DictConfig | None = None):
        self.ctx, self.device = dist_ctx, dist_ctx.device
        with self._megatron_context():
            self._build(model_path, model_cfg, engine_cfg, optim_cfg, total_optimizer_steps, value_head)
            # a mixture of experts (``moe``: actor.moe): the routing its forwards replay and record
            self.routing = self._routing(moe, optim_cfg is not None) if moe is not None and self.shape.num_experts \
                else None
        # trained over pipeline stages or with recomputed layers: the routers' loss from a counting pass
        counts = self.routing is not None and self.routing.trained and (self.pp > 1 or engine_cfg.recompute_activations)
        self.counted = CountedRouting(self.routing.tap, self.pp_group) if counts else None
        self._routed = None  # the last forward's (routing, rows, micro-batch tensors), for its loss

    def _megatron_context(self) -> contextlib.AbstractContextManager:
        """What every call into Megatron-Core runs inside: on CPU, :data:`cpu.redirected`; nothing on a GPU."""
        return cpu.redirected() if self.device.type == "cpu" else contextlib.nullcontext()

    def _build(self, model_path: str, model_cfg: DictConfig, engine_cfg: DictConfig, optim_cfg: DictConfig | None,
               total_optimizer_steps: int, value_head: bool) -> None:
        """The model-parallel state, the model with this rank's slice of the Hugging Face weights, and its
        optimizer."""
        from megatron.core import parallel_state as ps
        from transformers import AutoConfig

        tp, pp, ep = (engine_cfg.tensor_model_parallel_size, engine_cfg.pipeline_model_parallel_size,
                      engine_cfg.expert_model_parallel_size)
        hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=model_cfg.trust_remote_code)
        _check_trains(hf_config, model_path)  # a hub id's config is read only here (check_config: a known one's)
        self.shape = GPTShape.from_hf_config(hf_config)
        self.model_aux_loss_coef = getattr(hf_config, "router_aux_loss_coef", 0.0)  # a mixture of experts' default
        data_parallel_size(self.ctx.world_size, tp, pp, self.shape, ep)  # a clear error for sizes that do not fit
        _check_experts(self.shape, engine_cfg)
        _init_parallel_state(tp, pp, ep, self.device, seed=0)
        self.tp_rank, self.tp = ps.get_tensor_model_parallel_rank(), tp
        self.pp_rank, self.pp = ps.get_pipeline_model_parallel_rank(), pp
        self.first_stage, self.last_stage = self.pp_rank == 0, self.pp_rank == pp - 1
        self.tp_group, self.pp_group = ps.get_tensor_model_parallel_group(), ps.get_pipeline_model_parallel_group()
        self.dp_group, self.model_parallel_group = ps.get_data_parallel_group(), ps.get_model_parallel_group()
        # the experts: each on one rank of its expert-parallel group, replicated over the expert-data-parallel one
        self.ep, self.ep_rank = ep, ps.get_expert_model_parallel_rank()
        self.ep_group, self.expert_dp_group = ps.get_expert_model_parallel_group(), ps.get_expert_data_parallel_group()
        self.expert_model_group = ps.get_expert_tensor_model_pipeline_parallel_group()
        self.value_head, self.sequence_parallel = value_head, engine_cfg.sequence_parallel
        # bf16 compute with fp32 weights, gradients and optimizer (as FSDP's mixed precision): Megatron-Core's
        # layers cast under CUDA autocast, in forward and in backward. bf16 weights (params_dtype=bf16) compute
        # in bf16 as they are, and the optimizer steps fp32 master copies of them.
        self.params_dtype = torch.bfloat16 if engine_cfg.params_dtype == "bf16" else torch.float32
        bf16 = self.computes_in(engine_cfg, self.device.type) == "bfloat16" and self.device.type == "cuda"
        self.compute = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
        self.tied_output = self.shape.tied_embeddings and not value_head  # the output layer is the embedding
        hf, padding_idx = _hf_weights(model_path, model_cfg, value_head, self.device)
        self._model = _build_model(hf_config, engine_cfg, self.params_dtype, self.first_stage, self.last_stage,
                                   value_head, self.device)
        names = [name for name in self._model.state_dict() if not name.endswith("_extra_state")]
        # each expert weight and the layer's tensor it is a piece of (a layer's local experts' fc1 or fc2)
        self.expert_params = {p: re.sub(r"local_experts\.\d+\.", "", name)
                              for name, p in self._model.named_parameters() if LOCAL_EXPERT in name}
        self.shards = RankShards(self.shape, tp, self.tp_rank, pp, self.pp_rank, names, list(hf), self.tied_output,
                                 self.tp_group, self.pp_group, self.device, ep, self.ep_rank, self.ep_group)
        try:
            for name in self.shards.hf_names:
                megatron_name(name)
            weights = self.shards.from_hf(hf)
        except ValueError as err:
            raise ValueError(f"{model_path}: {err}; only Qwen2 / Qwen3 / Llama models and Qwen3-MoE convert to "
                             f"Megatron") from None
        self._model.load_state_dict(weights, strict=False)  # every weight: only TransformerEngine's extra state is left
        self._model.to(self.device)
        if padding_idx is not None and self.first_stage:  # as torch's Embedding(padding_idx=...): no lookup gradient
            self._model.embedding.word_embeddings.register_forward_hook(no_grad_at(padding_idx))
        if optim_cfg is None:
            self._model.requires_grad_(False)
        self.optim = self._optimizer(engine_cfg, optim_cfg, total_optimizer_steps) if optim_cfg else None
        if self.optim is not None and self.optim.masters:
            _copy_masters(masters_here(self._model, self.optim), weights)

    def _optimizer(self, engine_cfg: DictConfig, optim_cfg: DictConfig, total_optimizer_steps: int) -> Optimizer:
        """AdamW over the model. The distributed optimizer shares each weight's state out over the ranks that hold
        it: an expert's over its expert-data-parallel group (a layer's local experts stepped on one rank: one piece
        of a checkpoint's tensor), the others' over the data-parallel replicas."""
        shard_group = (lambda p: self.expert_dp_group if p in self.expert_params else self.dp_group) \
            if engine_cfg.use_distributed_optimizer else None
        return Optimizer(self._model.parameters(), optim_cfg, total_optimizer_steps, grad_norm=self._grad_norm,
                         shard_group=shard_group, shard_unit=lambda p: self.expert_params.get(p, p),
                         master_weights=self.params_dtype != torch.float32)

    def _routing(self, moe: DictConfig, trained: bool) -> RoutedForward:
        """A mixture of experts' routing policy (``actor.moe``) over Megatron-Core's routers; the load-balancing
        loss's coefficient ``moe.aux_loss_coef``, or the model config's ``router_aux_loss_coef``."""
        coef = self.model_aux_loss_coef if moe.aux_loss_coef is None else moe.aux_loss_coef
        tap = MegatronRouterTap(self._model, float(coef), self.tp_group, self.sequence_parallel, self.pp_group)
        return RoutedForward(tap, moe.router_replay, trained)

    def own_routing(self):
        return self.routing.own_routing() if self.routing is not None else contextlib.nullcontext()

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    @property
    @_runs_megatron
    def layout(self) -> ParallelLayout:
        from megatron.core import parallel_state

        return ParallelLayout(dp_rank=parallel_state.get_data_parallel_rank(),
                              dp_size=parallel_state.get_data_parallel_world_size(),
                              collects=self.tp_rank == 0 and self.last_stage)

    def all_reduce_dp(self, values: list[float], op: str = "sum") -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=REDUCE_OPS[op], group=self.dp_group)
        return tensor.tolist()

    def _seq_length(self, micro: Batch) -> int:
        """The length a micro-batch runs at: with sequence parallelism a multiple of tp (each rank holds an
        equal slice of the sequence)."""
        seq = micro.tensors["input_ids"].shape[1]
        return -(-seq // self.tp) * self.tp if self.sequence_parallel else seq

    def _stage_forward(self, micro: Batch, as_training: bool | None = None) -> torch.Tensor:
        """This stage's part of the forward pass: the logits ``[B, T, V / tp]`` on the last stage, the
        hidden states for the next stage elsewhere (the schedule feeds a later stage its input). A mixture of
        experts routes as a training forward does when ``as_training`` (default: when gradients are on)."""
        t = {k: v.to(self.device) for k, v in micro.tensors.items()
             if k in ("input_ids", "attention_mask", "position_ids")}
        seq, run = t["input_ids"].shape[1], self._seq_length(micro)
        if run > seq:  # positions appended at the end, masked out: causal attention keeps them out of the rest
            t = {k: torch.nn.functional.pad(v, (0, run - seq)) for k, v in t.items()}
        if self.first_stage:
            self.tokens_real += int(t["attention_mask"].sum())
            self.tokens_computed += t["input_ids"].numel()
        causal = torch.ones(run, run, dtype=torch.bool, device=self.device).triu(1)
        masked = causal[None, None] | ~t["attention_mask"].bool()[:, None, None, :]  # True = not attended
        routes, self._routed = contextlib.nullcontext(), None
        if self.routing is not None:
            rows = SequenceFirstRows(t["attention_mask"], run)
            as_training = torch.is_grad_enabled() if as_training is None else as_training
            routes = self.routing.around(rows, micro.tensors, as_training)
            if self.counted is not None and torch.is_grad_enabled():
                self.counted.begin(rows)
        with self.compute(), routes as routing:
            out = self._model(t["input_ids"], t["position_ids"], masked)
        if routing is not None:
            self._routed = (routing, rows, micro.tensors)
        if self.counted is not None and torch.is_grad_enabled():
            out = self.counted.routes_again(out)
        return out[:, :seq] if self.last_stage else out.contiguous()  # (sent to the next stage as it is)

    def _outputs(self, logits: torch.Tensor, micro: Batch, temperature: float, need_entropy: bool,
                 need_sum_pi_squared: bool) -> ForwardOutput:
        """The response positions' outputs from the last stage's logits (a value model's: its values)."""
        responses = micro.tensors["responses"].to(self.device)
        logits = logits[:, -responses.shape[1] - 1: -1].float()
        if self.value_head:
            return ForwardOutput(values=logits.squeeze(-1))
        logits = mask_vocab_padding(logits / temperature, self.tp_rank, self.shape.vocab_size)
        out = vocab_parallel_outputs(logits, responses, self.tp_rank * logits.shape[-1], need_entropy,
                                     need_sum_pi_squared)
        if self.counted is not None and torch.is_grad_enabled():  # the routers added their terms: the metrics
            out.router_loss, out.router_metrics = logits.new_zeros(()), self.counted.metrics
        elif self._routed is not None:  # a mixture of experts: what the forward routed (its loss, metrics, record)
            routing, rows, tensors = self._routed
            self.routing.finish(out, routing, rows, tensors, torch.is_grad_enabled())
        return out

    @_runs_megatron
    def forward(self, micro: Batch, *, temperature=1.0, need_entropy=False, need_sum_pi_squared=False, grad=False):
        if self.pp > 1:
            raise RuntimeError("a pipeline stage has no outputs of its own: use infer / train_mini_batch")
        with torch.set_grad_enabled(grad):
            return self._outputs(self._stage_forward(micro), micro, temperature, need_entropy, need_sum_pi_squared)

    def _schedule(self, pieces: list[Batch], per_micro, forward_only: bool, after_forward=None,
                  as_training: bool | None = None) -> list:
        """Run the micro-batches ``pieces`` through Megatron-Core's forward(-backward) schedule (pipelined when pp > 1);
        ``per_micro(logits, micro) -> (scalar loss, result)`` runs on the last stage, whose results are
        returned in order (an empty list on the other stages). ``after_forward(output, routed)`` sees each of this
        stage's forwards (a mixture of experts' counting pass and r2's record over stages: :class:`CountedRouting`)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        micros = list(pieces)

        def step(data_iterator, model):
            micro = next(data_iterator)
            output = self._stage_forward(micro, as_training)
            if after_forward is not None:
                output = after_forward(output, self._routed)

            def loss_func(logits):
                loss, result = per_micro(logits, micro)
                return loss, torch.zeros((), dtype=torch.int), result

            return output, loss_func

        return get_forward_backward_func()(
            forward_step_func=step, data_iterator=iter(micros), model=[self._model], num_microbatches=len(micros),
            seq_length=max(self._seq_length(m) for m in micros),
            micro_batch_size=max(len(m) for m in micros), forward_only=forward_only)

    def _from_last_stage(self, value):
        """The last pipeline stage's ``value`` on every stage (a Python object of CPU tensors and numbers)."""
        if self.pp == 1:
            return value
        from megatron.core import parallel_state

        box = [value]
        dist.broadcast_object_list(box, src=parallel_state.get_pipeline_model_parallel_last_rank(),
                                   group=self.pp_group)
        return box[0]

    @_runs_megatron
    def infer(self, batch, *, split, temperature=1.0, need_entropy=False, need_sum_pi_squared=False):
        def outputs(logits, micro):
            fwd = self._outputs(logits, micro, temperature, need_entropy, need_sum_pi_squared)
            return logits.new_zeros(()), {name: value.cpu() if name == "routed_experts" else value.float().cpu()
                                          for name, value in vars(fwd).items() if value is not None}

        keeps = self.pp > 1 and self.counted is not None and self.routing.records(grad=False)
        with torch.no_grad():
            results = self._schedule(micro_batches(self, batch, split), outputs, forward_only=True,
                                     after_forward=self.counted.keep if keeps else None)
        for result, record in zip(results, self.counted.joined_records() if keeps else []):
            result["routed_experts"] = record  # r2's record: every stage's layers
        merged = {name: torch.cat([r[name] for r in results]) for name in results[0]} if results else None
        return self._from_last_stage(merged)

    @_runs_megatron
    def train_mini_batch(self, mini, loss_fn, *, split, temperature=1.0, need_entropy=False):
        self._check_trainable()

        def loss(logits, micro):
            return loss_fn(self._outputs(logits, micro, temperature, need_entropy, False), micro)

        micros = list(micro_batches(self, mini, split))
        if self.counted is not None:  # the counting pass: every layer's routing of each micro-batch
            with torch.no_grad():
                self._schedule(micros, _no_loss, True, after_forward=self.counted.collect, as_training=True)
            self.counted.count(micros, self.all_reduce_dp([float(mini.tensors["response_mask"].sum())])[0])
        metrics: dict[str, float] = {}
        for micro_metrics in self._schedule(micros, loss, forward_only=False):
            add_metrics(metrics, micro_metrics)
        return self._step_optimizer(self._from_last_stage(metrics))

    @_runs_megatron
    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()  # recomputed layers run their forward again here

    @_runs_megatron
    def reduce_gradients(self) -> None:
        """Sum the gradients over the replicas (the losses use global denominators; an expert's over the ranks
        that hold it, its expert-data-parallel group); with sequence parallelism, the norms' and routers' over the
        tensor-parallel ranks (each saw its slice of the sequence); with tied embeddings split over pipeline
        stages, over the embedding and its output-layer copy, so that both copies take the same step."""
        from megatron.core import parallel_state

        for param in self.optim.params:
            if (grad := self.optim.grad(param)) is not None:  # bf16 weights: the fp32 main gradient
                dist.all_reduce(grad, group=self.expert_dp_group if param in self.expert_params else self.dp_group)
                if getattr(param, "sequence_parallel", False):
                    dist.all_reduce(grad, group=self.tp_group)
        if self.pp > 1 and self.tied_output and parallel_state.is_rank_in_embedding_group():
            weight = self._model.shared_embedding_or_output_weight()
            dist.all_reduce(self.optim.grad(weight), group=parallel_state.get_embedding_group())

    def _grad_norm(self, params: list[torch.nn.Parameter]) -> torch.Tensor:
        """The global gradient norm: tensor-parallel shards counted once each, replicated weights once, the
        last stage's copy of a tied embedding not at all, each expert once (summed over the expert-parallel
        ranks, which hold different experts)."""
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        squares = torch.zeros(2, dtype=torch.float64, device=self.device)  # [the other weights, the experts]
        for param in params:
            grad = self.optim.grad(param)
            if param in self.expert_params:
                squares[1] += grad.double().square().sum() if grad is not None else 0
            elif grad is not None and param_is_not_tensor_parallel_duplicate(param) \
                    and not getattr(param, "shared", False):
                squares[0] += grad.double().square().sum()
        dist.all_reduce(squares[:1], group=self.model_parallel_group)
        if self.expert_params:
            dist.all_reduce(squares[1:], group=self.expert_model_group)
        return squares.sum().sqrt().float()

    def export_weights(self, dtype=None, bucket_bytes=512 * 2**20):
        """:meth:`RankShards.export_buckets`: the Hugging Face weights streamed one unit at a time."""
        with self._megatron_context():
            state = self._model.state_dict()  # references to the weights: built once, not per unit
        yield from self.shards.export_buckets(state, dtype, bucket_bytes, self._megatron_context)

    @_runs_megatron
    def blend_weights(self, buckets, alpha):
        """:meth:`RankShards.blend`: a rank holds about one bucket beside its own shard."""
        self.shards.blend(self._model.state_dict(), buckets, alpha)

    @_runs_megatron
    def close(self) -> None:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()  # its groups die with the process group

    @_runs_megatron
    def save_checkpoint(self, path: str) -> None:
        """A torch.distributed.checkpoint directory of Hugging Face-named slices
        (:mod:`rlplat.engines.megatron.checkpoint`)."""
        import torch.distributed.checkpoint as dcp

        dcp.save(checkpoint_state(self.shards, self._model, self.optim), checkpoint_id=path)
        save_rank_state(path, self.ctx.rank, self.optim)

    @_runs_megatron
    def load_checkpoint(self, path: str) -> None:
        """Reads this rank's slices, whatever layout wrote them (:func:`load_checkpoint_state`)."""
        load_checkpoint_state(self.shards, self._model, self.optim, path)
        load_rank_state(path, self.ctx.rank, self.optim)
