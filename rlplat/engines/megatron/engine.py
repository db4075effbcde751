"""Megatron-Core training engine (``<role>.strategy=megatron``): a ``GPTModel`` split over
``tensor_model_parallel_size`` workers, replicated over the rest (data parallel).

Weights come from the Hugging Face checkpoint (:mod:`rlplat.engines.megatron.convert`) and leave in
Hugging Face names, so the rollout engines and the export see the same weights as with FSDP. Log-probs,
entropy and ``sum_pi_squared`` are computed on vocabulary-parallel logits without gathering them (one
all-reduce of the max, of the normaliser and of the picked logit per position). Gradients are summed over
the data-parallel group (the losses are normalised by global denominators) and clipped by the global norm
over the tensor-parallel shards. Pipeline parallelism and a value head (critic) are not supported yet:
validation says so in one line.

On CPU (tests, small runs) Megatron-Core's CUDA device lookups are pointed at the CPU and its inference RNG
tracker is used (rlplat builds the model without dropout, so no RNG is drawn).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from rlplat.config.errors import ConfigError
from rlplat.engines.base import ForwardOutput, ParallelLayout, TrainingEngine, blend_, check_blended
from rlplat.engines.dist import REDUCE_OPS, DistContext
from rlplat.engines.megatron.convert import GPTShape, data_parallel_size, hf_to_megatron, megatron_to_hf
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
        at_pad = (inputs[0] == padding_idx).unsqueeze(-1)
        return torch.where(at_pad, output.detach(), output)

    return hook


def _init_parallel_state(tp: int, device: torch.device, seed: int) -> None:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import initialize_rng_tracker, model_parallel_cuda_manual_seed

    if parallel_state.model_parallel_is_initialized():
        if parallel_state.get_tensor_model_parallel_world_size() != tp:
            raise RuntimeError("two Megatron engines in one worker need the same tensor_model_parallel_size")
        return
    if device.type == "cpu":
        torch.cuda.current_device = lambda: "cpu"
        initialize_rng_tracker(inference_rng_tracker=True)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
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
        if role == "critic":
            raise ConfigError("critic.strategy=megatron is not supported yet (no value head); use critic.strategy=fsdp")
        tp, pp = engine_cfg.tensor_model_parallel_size, engine_cfg.pipeline_model_parallel_size
        if engine_cfg.recompute_activations and device != "cuda":
            raise ConfigError(f"{key}.recompute_activations needs a GPU (Megatron-Core's recomputation saves the "
                              f"CUDA random state; trainer.device resolved to {device})")
        if pp != 1:
            raise ConfigError(f"{key}.pipeline_model_parallel_size={pp}: pipeline parallelism is not supported "
                              f"yet; use 1")
        try:  # for a hub id the model's side is checked when it loads
            data_parallel_size(world_size, tp, pp, model_shape(cfg.model))
        except ValueError as err:
            raise ConfigError(f"{key}: {err}") from None

    def __init__(self, model_path: str, model_cfg: DictConfig, engine_cfg: DictConfig, dist_ctx: DistContext,
                 optim_cfg: DictConfig | None = None, total_optimizer_steps: int = 1, value_head: bool = False):
        from megatron.core import parallel_state
        from transformers import AutoConfig, AutoModelForCausalLM

        if value_head:
            raise ValueError("the Megatron engine has no value head yet; use critic.strategy=fsdp")
        tp = engine_cfg.tensor_model_parallel_size
        self.ctx, self.device = dist_ctx, dist_ctx.device
        _init_parallel_state(tp, self.device, seed=0)
        hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=model_cfg.trust_remote_code)
        self.shape = GPTShape.from_hf_config(hf_config)
        data_parallel_size(dist_ctx.world_size, tp, 1, self.shape)  # a clear error for sizes that do not fit
        self.tp_rank, self.tp = parallel_state.get_tensor_model_parallel_rank(), tp
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.dp_group = parallel_state.get_data_parallel_group()
        recompute = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1} \
            if engine_cfg.recompute_activations else {}
        self._model = build_gpt_model(hf_config, tensor_model_parallel_size=tp, **recompute)
        hf_model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32,
                                                        trust_remote_code=model_cfg.trust_remote_code)
        hf = hf_model.state_dict()
        self.hf_names = list(hf)  # exported under these names (a tied lm_head included, as HF lists it)
        padding_idx = hf_model.get_input_embeddings().padding_idx
        shard = hf_to_megatron(hf, self.shape, tp)[self.tp_rank]
        missing, unexpected = self._model.load_state_dict(shard, strict=False)
        missing = [name for name in missing if not name.endswith("_extra_state")]
        if missing or unexpected:
            raise ValueError(f"{model_path}: the converted weights do not fit the Megatron model (missing "
                             f"{missing[:4]}, unexpected {unexpected[:4]}); only dense Qwen2 / Llama models fit")
        self._model.to(self.device)
        if padding_idx is not None:  # as torch's Embedding(padding_idx=...): that row gets no lookup gradient
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
                              dp_size=parallel_state.get_data_parallel_world_size(), collects=self.tp_rank == 0)

    def all_reduce_dp(self, values: list[float], op: str = "sum") -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=REDUCE_OPS[op], group=self.dp_group)
        return tensor.tolist()

    def forward(self, micro: Batch, *, temperature=1.0, need_entropy=False, need_sum_pi_squared=False, grad=False):
        t = {k: v.to(self.device) for k, v in micro.tensors.items()
             if k in ("input_ids", "attention_mask", "position_ids", "responses")}
        seq, response_len = t["input_ids"].shape[1], t["responses"].shape[1]
        self.tokens_real += int(t["attention_mask"].sum())
        self.tokens_computed += t["input_ids"].numel()
        causal = torch.ones(seq, seq, dtype=torch.bool, device=self.device).triu(1)
        masked = causal[None, None] | ~t["attention_mask"].bool()[:, None, None, :]  # True = not attended
        with torch.set_grad_enabled(grad):
            logits = self._model(t["input_ids"], t["position_ids"], masked)[:, -response_len - 1: -1].float()
            logits = self._mask_vocab_padding(logits / temperature)
            return vocab_parallel_outputs(logits, t["responses"], self.tp_rank * logits.shape[-1], need_entropy,
                                          need_sum_pi_squared)

    def _mask_vocab_padding(self, logits: torch.Tensor) -> torch.Tensor:
        """The rows Megatron added to make the vocabulary divisible by tp get no probability."""
        start = self.tp_rank * logits.shape[-1]
        real = max(0, min(logits.shape[-1], self.shape.vocab_size - start))
        if real == logits.shape[-1]:
            return logits
        pad = torch.full_like(logits[..., real:], -1e9)
        return torch.cat([logits[..., :real], pad], dim=-1)

    def reduce_gradients(self) -> None:
        for param in self.optim.params:  # the losses use global denominators: sum over the replicas
            if param.grad is not None:
                dist.all_reduce(param.grad, group=self.dp_group)

    def _grad_norm(self, params: list[torch.nn.Parameter]) -> torch.Tensor:
        """The global gradient norm: tensor-parallel shards counted once each, replicated weights once."""
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        squares = torch.zeros((), dtype=torch.float64, device=self.device)
        for param in params:
            if param.grad is not None and param_is_not_tensor_parallel_duplicate(param):
                squares += param.grad.double().square().sum()
        dist.all_reduce(squares, group=self.tp_group)
        return squares.sqrt().float()

    def export_weights(self, dtype=None, bucket_bytes=512 * 2**20):
        """Gather every tensor-parallel shard, convert, and yield Hugging Face weights in buckets. Unlike
        FSDP's stream this holds the full model once per call (a per-layer stream is to come)."""
        state = self._model.state_dict()
        names = [name for name in state if not name.endswith("_extra_state")]
        full = {}
        for name in names:
            pieces = [torch.empty_like(state[name]) for _ in range(self.tp)]
            dist.all_gather(pieces, state[name].contiguous(), group=self.tp_group)
            full[name] = [piece.cpu() for piece in pieces]
        shards = [{name: full[name][rank] for name in names} for rank in range(self.tp)]
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
        shard = hf_to_megatron(hf, self.shape, self.tp)[self.tp_rank]
        state = self._model.state_dict()
        with torch.no_grad():
            for name, tensor in shard.items():
                blend_(state[name], tensor.to(self.device), alpha)

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
