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
so the roles see the same answers at any pp. A value head (critic) is not supported yet: validation says
so in one line.

On CPU (tests, small runs) Megatron-Core's CUDA-only calls are pointed at the CPU
(:mod:`rlplat.engines.megatron.cpu`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from rlplat.config.errors import ConfigError
from rlplat.engines.base import ForwardOutput, ParallelLayout, TrainingEngine, blend_, check_blended
from rlplat.engines.dist import REDUCE_OPS, DistContext
from rlplat.engines.megatron.convert import (GPTShape, data_parallel_size, from_stages, hf_to_megatron,
                                             megatron_to_hf, to_stage)
from rlplat.engines.megatron.model import build_gpt_model
from rlplat.engines.optim import Optimizer
from rlplat.protocol import Batch


def model_shape(model_cfg) -> GPTShape | None:
    """The architecture of ``model.path`` when it is known without downloading (a local directory or the
    embedded model); None for a hub id."""
    import os

    from transformers import AutoConfig

    if model_cfg.path == "embedded":
        from rlplat.models.embedded import SPEC

        return GPTShape(SPEC.num_hidden_layers, SPEC.hidden_size, SPEC.num_attention_heads,
                        SPEC.num_key_value_heads, SPEC.intermediate_size, 0, SPEC.tie_word_embeddings)
    if not os.path.isfile(os.path.join(model_cfg.path, "config.json")):
        return None
    config = AutoConfig.from_pretrained(model_cfg.path, trust_remote_code=model_cfg.trust_remote_code)
    return GPTShape.from_hf_config(config)


def _no_grad_at(padding_idx: int):
    """A forward hook for the word embedding: positions holding ``padding_idx`` pass no gradient to the
    embedding (the Hugging Face model's ``padding_idx`` semantics; a sampled pad token is one)."""

    def hook(module, inputs, output):
        at_pad = inputs[0] == padding_idx  # [B, T]
        if module.reduce_scatter_embeddings:  # sequence parallel: output [T / tp, B, H], this rank's slice
            at_pad = at_pad.t().chunk(dist.get_world_size(module.tp_group))[dist.get_rank(module.tp_group)]
        return torch.where(at_pad.unsqueeze(-1), output.detach(), output)

    return hook


def _init_parallel_state(tp: int, pp: int, device: torch.device, seed: int) -> None:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if parallel_state.model_parallel_is_initialized():
        if (parallel_state.get_tensor_model_parallel_world_size(),
                parallel_state.get_pipeline_model_parallel_world_size()) != (tp, pp):
            raise RuntimeError("two Megatron engines in one worker need the same tensor and pipeline parallel sizes")
        return
    if device.type == "cpu":
        from rlplat.engines.megatron import cpu

        cpu.use_cpu()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    if device.type == "cuda":
        model_parallel_cuda_manual_seed(seed)


def _tp_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over the tensor-parallel group; the gradient passes through unchanged (the loss is the same on
    every tensor-parallel rank)."""
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    return reduce_from_tensor_model_parallel_region(tensor)


def vocab_parallel_outputs(logits: torch.Tensor, targets: torch.Tensor, vocab_start: int, need_entropy: bool,
                           need_sum_pi_squared: bool) -> ForwardOutput:
    """Log-prob of ``targets`` ``[B, R]`` (and entropy, Σπ²) from this rank's vocabulary slice of the
    logits ``[B, R, V / tp]``, which start at id ``vocab_start``."""
    from megatron.core import parallel_state

    peak = logits.detach().amax(-1, keepdim=True)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=parallel_state.get_tensor_model_parallel_group())
    shifted = logits - peak
    log_norm = _tp_sum(shifted.exp().sum(-1, keepdim=True)).log()
    local = targets - vocab_start
    inside = (local >= 0) & (local < logits.shape[-1])
    picked = shifted.gather(-1, local.clamp(0, logits.shape[-1] - 1).unsqueeze(-1)).squeeze(-1) * inside
    out = ForwardOutput(log_probs=_tp_sum(picked) - log_norm.squeeze(-1))
    if need_entropy or need_sum_pi_squared:
        log_p = shifted - log_norm
        p = log_p.exp()
        out.entropy = -_tp_sum((p * log_p).sum(-1)) if need_entropy else None
        out.sum_pi_squared = _tp_sum(p.square().sum(-1)) if need_sum_pi_squared else None
    return out


class MegatronEngine(TrainingEngine):
    """One Megatron-Core ``GPTModel``; ``optim_cfg=None`` builds a frozen engine (the reference policy)."""

    @classmethod
    def check_config(cls, cfg, role, world_size, device):
        super().check_config(cfg, role, world_size, device)
        engine_cfg, key = cfg[role].megatron, f"{role}.megatron"
        tp, pp = engine_cfg.tensor_model_parallel_size, engine_cfg.pipeline_model_parallel_size
        try:  # for a hub id the model's side is checked when it loads
            data_parallel_size(world_size, tp, pp, model_shape(cfg.model))
        except ValueError as err:
            raise ConfigError(f"{key}: {err}") from None
        if engine_cfg.sequence_parallel and tp == 1:
            raise ConfigError(f"{key}.sequence_parallel=true needs {key}.tensor_model_parallel_size > 1 (the "
                              f"sequence is split over the tensor-parallel ranks)")

    def __init__(self, model_path: str, model_cfg: DictConfig, engine_cfg: DictConfig, dist_ctx: DistContext,
                 optim_cfg: DictConfig | None = None, total_optimizer_steps: int = 1, value_head: bool = False):
        import contextlib

        from megatron.core import parallel_state as ps
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

        tp, pp = engine_cfg.tensor_model_parallel_size, engine_cfg.pipeline_model_parallel_size
        self.ctx, self.device = dist_ctx, dist_ctx.device
        _init_parallel_state(tp, pp, self.device, seed=0)
        hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=model_cfg.trust_remote_code)
        self.shape = GPTShape.from_hf_config(hf_config)
        data_parallel_size(dist_ctx.world_size, tp, pp, self.shape)  # a clear error for sizes that do not fit
        self.tp_rank, self.tp = ps.get_tensor_model_parallel_rank(), tp
        self.pp_rank, self.pp = ps.get_pipeline_model_parallel_rank(), pp
        self.first_stage, self.last_stage = self.pp_rank == 0, self.pp_rank == pp - 1
        self.tp_group, self.pp_group = ps.get_tensor_model_parallel_group(), ps.get_pipeline_model_parallel_group()
        self.dp_group, self.model_parallel_group = ps.get_data_parallel_group(), ps.get_model_parallel_group()
        self.value_head, self.sequence_parallel = value_head, engine_cfg.sequence_parallel
        self.tied_output = self.shape.tied_embeddings and not value_head  # the output layer is the embedding
        # the Hugging Face model first: a value model's fresh head draws from the seeded generator as the
        # FSDP engine's does, and every worker takes rank 0's (the replicas and shards must hold one head)
        auto = AutoModelForTokenClassification if value_head else AutoModelForCausalLM
        hf_model = auto.from_pretrained(model_path, dtype=torch.float32, trust_remote_code=model_cfg.trust_remote_code,
                                        **({"num_labels": 1} if value_head else {}))
        hf = hf_model.state_dict()
        for name in ("score.weight", "score.bias") if value_head else ():
            head = hf[name].to(self.device)
            dist.broadcast(head, src=0)
            hf[name] = head.cpu()
        self.hf_names = list(hf)  # exported under these names (a tied lm_head included, as HF lists it)
        padding_idx = hf_model.get_input_embeddings().padding_idx
        del hf_model
        recompute = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1} \
            if engine_cfg.recompute_activations else {}
        if self.device.type == "cpu":
            from rlplat.engines.megatron import cpu

            building = cpu.building()
        else:
            building = contextlib.nullcontext()
        with building:  # the losses carry the global denominators: the schedule must not rescale them
            self._model = build_gpt_model(hf_config, pre_process=self.first_stage, post_process=self.last_stage,
                                          value_head=value_head, tensor_model_parallel_size=tp,
                                          pipeline_model_parallel_size=pp, calculate_per_token_loss=True,
                                          sequence_parallel=self.sequence_parallel, **recompute)
        shard = to_stage(hf_to_megatron(hf, self.shape, tp)[self.tp_rank], self.shape, pp, self.pp_rank)
        missing, unexpected = self._model.load_state_dict(shard, strict=False)
        missing = [name for name in missing if not name.endswith("_extra_state")]
        if missing or unexpected:
            raise ValueError(f"{model_path}: the converted weights do not fit the Megatron model (missing "
                             f"{missing[:4]}, unexpected {unexpected[:4]}); only dense Qwen2 / Llama models fit")
        self._model.to(self.device)
        if padding_idx is not None and self.first_stage:  # as torch's Embedding(padding_idx=...): no lookup gradient
            self._model.embedding.word_embeddings.register_forward_hook(_no_grad_at(padding_idx))
        if optim_cfg is None:
            self._model.requires_grad_(False)
        self.optim = Optimizer(self._model.parameters(), optim_cfg, total_optimizer_steps,
                               grad_norm=self._grad_norm) if optim_cfg else None

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    @property
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

    def _stage_forward(self, micro: Batch) -> torch.Tensor:
        """This stage's part of the forward pass: the logits ``[B, T, V / tp]`` on the last stage, the
        hidden states for the next stage elsewhere (the schedule feeds a later stage its input)."""
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
        out = self._model(t["input_ids"], t["position_ids"], masked)
        return out[:, :seq] if self.last_stage else out

    def _outputs(self, logits: torch.Tensor, micro: Batch, temperature: float, need_entropy: bool,
                 need_sum_pi_squared: bool) -> ForwardOutput:
        """The response positions' outputs from the last stage's logits (a value model's: its values)."""
        responses = micro.tensors["responses"].to(self.device)
        logits = logits[:, -responses.shape[1] - 1: -1].float()
        if self.value_head:
            return ForwardOutput(values=logits.squeeze(-1))
        logits = self._mask_vocab_padding(logits / temperature)
        return vocab_parallel_outputs(logits, responses, self.tp_rank * logits.shape[-1], need_entropy,
                                      need_sum_pi_squared)

    def forward(self, micro: Batch, *, temperature=1.0, need_entropy=False, need_sum_pi_squared=False, grad=False):
        if self.pp > 1:
            raise RuntimeError("a pipeline stage has no outputs of its own: use infer / train_mini_batch")
        with torch.set_grad_enabled(grad):
            return self._outputs(self._stage_forward(micro), micro, temperature, need_entropy, need_sum_pi_squared)

    def _schedule(self, micro_batches, per_micro, forward_only: bool) -> list:
        """Run ``micro_batches`` through Megatron-Core's forward(-backward) schedule (pipelined when pp > 1);
        ``per_micro(logits, micro) -> (scalar loss, result)`` runs on the last stage, whose results are
        returned in order (an empty list on the other stages)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        micros = list(micro_batches)

        def step(data_iterator, model):
            micro = next(data_iterator)
            output = self._stage_forward(micro)

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

    def infer(self, micro_batches, *, temperature=1.0, need_entropy=False, need_sum_pi_squared=False):
        def outputs(logits, micro):
            fwd = self._outputs(logits, micro, temperature, need_entropy, need_sum_pi_squared)
            return logits.new_zeros(()), {name: value.float().cpu() for name, value in vars(fwd).items()
                                          if value is not None}

        with torch.no_grad():
            results = self._schedule(micro_batches, outputs, forward_only=True)
        merged = {name: torch.cat([r[name] for r in results]) for name in results[0]} if results else None
        return self._from_last_stage(merged)

    def train_mini_batch(self, micro_batches, loss_fn, *, temperature=1.0, need_entropy=False):
        if self.optim is None:
            raise RuntimeError("this engine is frozen (built without an optimizer)")

        def loss(logits, micro):
            return loss_fn(self._outputs(logits, micro, temperature, need_entropy, False), micro)

        metrics: dict[str, float] = {}
        for micro_metrics in self._schedule(micro_batches, loss, forward_only=False):
            for k, v in micro_metrics.items():
                metrics[k] = metrics.get(k, 0.0) + v
        metrics = self._from_last_stage(metrics)
        self.reduce_gradients()
        keys = sorted(metrics)
        summed = dict(zip(keys, self.all_reduce_dp([metrics[k] for k in keys])))
        summed.update(self.optim.step())
        return summed

    def _mask_vocab_padding(self, logits: torch.Tensor) -> torch.Tensor:
        """The rows Megatron added to make the vocabulary divisible by tp get no probability."""
        start = self.tp_rank * logits.shape[-1]
        real = max(0, min(logits.shape[-1], self.shape.vocab_size - start))
        if real == logits.shape[-1]:
            return logits
        pad = torch.full_like(logits[..., real:], -1e9)
        return torch.cat([logits[..., :real], pad], dim=-1)

    def reduce_gradients(self) -> None:
        """Sum the gradients over the replicas (the losses use global denominators); with sequence
        parallelism, the norms' over the tensor-parallel ranks (each saw its slice of the sequence); with
        tied embeddings split over pipeline stages, over the embedding and its output-layer copy, so that
        both copies take the same step."""
        from megatron.core import parallel_state

        for param in self.optim.params:
            if param.grad is not None:
                dist.all_reduce(param.grad, group=self.dp_group)
                if getattr(param, "sequence_parallel", False):
                    dist.all_reduce(param.grad, group=self.tp_group)
        if self.pp > 1 and self.tied_output and parallel_state.is_rank_in_embedding_group():
            weight = self._model.shared_embedding_or_output_weight()
            dist.all_reduce(weight.grad, group=parallel_state.get_embedding_group())

    def _grad_norm(self, params: list[torch.nn.Parameter]) -> torch.Tensor:
        """The global gradient norm: tensor-parallel shards counted once each, replicated weights once, the
        last stage's copy of a tied embedding not at all."""
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        squares = torch.zeros((), dtype=torch.float64, device=self.device)
        for param in params:
            if param.grad is not None and param_is_not_tensor_parallel_duplicate(param) \
                    and not getattr(param, "shared", False):
                squares += param.grad.double().square().sum()
        dist.all_reduce(squares, group=self.model_parallel_group)
        return squares.sqrt().float()

    def export_weights(self, dtype=None, bucket_bytes=512 * 2**20):
        """Gather every tensor-parallel shard (and pipeline stage), convert, and yield Hugging Face weights
        in buckets. Unlike FSDP's stream this holds the full model once per call (a per-layer stream is to
        come)."""
        state = self._model.state_dict()
        names = [name for name in state if not name.endswith("_extra_state")]
        stage = {}  # name -> this stage's pieces, one per tensor-parallel rank
        for name in names:
            pieces = [torch.empty_like(state[name]) for _ in range(self.tp)]
            dist.all_gather(pieces, state[name].contiguous(), group=self.tp_group)
            stage[name] = [piece.cpu() for piece in pieces]
        stages = [stage]
        if self.pp > 1:
            stages = [None] * self.pp
            dist.all_gather_object(stages, stage, group=self.pp_group)
        shards = [from_stages([{name: pieces[rank] for name, pieces in part.items()} for part in stages], self.shape)
                  for rank in range(self.tp)]
        hf = megatron_to_hf(shards, self.shape)
        if "lm_head.weight" in self.hf_names and "lm_head.weight" not in hf:  # tied to the embedding
            hf["lm_head.weight"] = hf["model.embed_tokens.weight"]
        bucket, size = [], 0
        for name, tensor in ((name, hf[name]) for name in self.hf_names):
            tensor = tensor.to(dtype) if dtype is not None else tensor
            if bucket and size + tensor.numel() * tensor.element_size() > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
        if bucket:
            yield bucket

    def blend_weights(self, buckets, alpha):
        """Collects the full Hugging Face weights, converts them to this rank's tensor-parallel shard and
        blends it (the conversion only moves and slices, so it commutes with the blend)."""
        hf = {name: tensor for bucket in buckets for name, tensor in bucket}
        check_blended(set(hf), self.hf_names)
        shard = to_stage(hf_to_megatron(hf, self.shape, self.tp)[self.tp_rank], self.shape, self.pp, self.pp_rank)
        state = self._model.state_dict()
        with torch.no_grad():
            for name, tensor in shard.items():
                blend_(state[name], tensor.to(self.device), alpha)

    def close(self) -> None:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()  # its groups die with the process group

    def save_checkpoint(self, path: str) -> None:
        import os

        os.makedirs(path, exist_ok=True)
        state = {"model": self._model.state_dict(), "rng": torch.get_rng_state()}
        if self.optim is not None:
            state.update(optimizer=self.optim.optimizer.state_dict(), scheduler=self.optim.scheduler.state_dict())
        torch.save(state, f"{path}/megatron_rank{self.ctx.rank}.pt")

    def load_checkpoint(self, path: str) -> None:
        state = torch.load(f"{path}/megatron_rank{self.ctx.rank}.pt", weights_only=False, map_location=self.device)
        self._model.load_state_dict(state["model"])
        if self.optim is not None:
            self.optim.optimizer.load_state_dict(state["optimizer"])
            self.optim.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
