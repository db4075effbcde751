"""Log-probs and entropy of chosen tokens straight from the last hidden states, in chunks.

The plain way (``logits = lm_head(h)`` for every position, then ``log_softmax``) materialises a
``[B, T, V]`` tensor, and a float32 copy of it, for every position of the batch, and keeps them for the
backward pass. At a real vocabulary (V = 152k) that is the largest tensor of the step. Here the logits
exist only for the positions that predict response tokens, one chunk of positions at a time, and the
backward pass recomputes each chunk's logits instead of storing them (the approach of fused linear
cross-entropy kernels such as Liger's, without a custom kernel).

Per position with scaled logits ``z = W h / T`` (T = temperature) and ``p = softmax(z)``:

    log_prob = z[target] - logsumexp(z)
    entropy  = logsumexp(z) - Σ_v p_v z_v
    d log_prob / d z = onehot(target) - p
    d entropy / d z  = -p ⊙ (log p + entropy)

:func:`token_outputs` computes them and returns a :class:`TokenOutputs`. :class:`TokenOutputLM` is a Hugging
Face causal LM whose forward returns them instead of logits: a new module holding the causal LM's own
decoder (``model``) and output layer (``lm_head``) under the causal LM's names, so the parameters, their
names (state dict, checkpoints, export, weight sync) and a tie between the output layer and the input
embedding are unchanged, and nothing of the loaded model is patched. Its forward runs the decoder and then
:func:`token_outputs` with the output layer's weight, explicitly: as the root module of FSDP2 it is where
the root's parameters (embedding, final norm, output layer) are gathered before use and where FSDP hooks
the outputs for the backward pass.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from rlplat.models.vision import is_vision, vision_token_ids

#: model types whose causal-LM forward applies nothing to ``lm_head``'s output (no soft-capping or scaling)
PLAIN_HEAD_MODELS = frozenset({
    "llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mistral", "mixtral", "olmo2", "phi3", "smollm3",
    "qwen2_vl", "qwen2_5_vl", "qwen3_vl",
})
CHUNK_BYTES = 256 * 2**20  # float32 logits per chunk
#: how the output layer's outputs are computed (``<role>.fsdp.token_head``): ``chunked`` the steps above in eager
#: torch; ``fused`` the same steps with each chunk's passes over its logits compiled by ``torch.compile`` into a
#: few kernels (float32 inside, the logits read once in the compute dtype); ``liger`` liger-kernel's fused linear
#: cross-entropy (Triton, CUDA only) for the log-probs, and a chunked pass for the entropy when it is asked for
TOKEN_HEADS = ("chunked", "fused", "liger")


def _scaled_logits(hidden: torch.Tensor, weight: torch.Tensor, inv_temperature: float,
                   masked: torch.Tensor | None) -> torch.Tensor:
    """``(hidden @ weight.T) / T`` in float32 (no pass over the logits for the scaling at T = 1), the ``masked``
    tokens' at -1e9 (out of the softmax: a vision-language model's vision tokens, rlplat.models.vision)."""
    z = (hidden @ weight.T).float()
    z = z if inv_temperature == 1.0 else z.mul_(inv_temperature)
    return z if masked is None else z.index_fill_(-1, masked, -1e9)


def _chunk_forward(hidden, weight, targets, inv_temperature: float, masked, need_entropy: bool,
                   need_sum_pi_squared: bool):
    """One chunk's ``(log_prob, logsumexp, entropy or None, Σp² or None)``, each ``[rows]`` float32."""
    z = _scaled_logits(hidden, weight, inv_temperature, masked)
    lse = torch.logsumexp(z, dim=-1)
    log_prob = z.gather(-1, targets[:, None]).squeeze(-1) - lse
    entropy = sum_sq = None
    if need_entropy or need_sum_pi_squared:
        p = torch.exp(z - lse[:, None])
        entropy = lse - torch.linalg.vecdot(p, z) if need_entropy else None
        sum_sq = p.square().sum(-1) if need_sum_pi_squared else None
    return log_prob, lse, entropy, sum_sq


def _chunk_backward(hidden, weight, targets, log_norm, entropy, grad_log_prob, grad_entropy, inv_temperature: float,
                    masked, want_hidden: bool, want_weight: bool):
    """One chunk's ``(grad_hidden or None, grad_weight or None)`` (the weight's in float32) from the gradients of
    its log-probs and entropies (either None: no gradient), the logits recomputed (module docstring)."""
    z = _scaled_logits(hidden, weight, inv_temperature, masked)
    log_p = z - log_norm[:, None]
    p = log_p.exp()
    del z
    if grad_log_prob is not None:
        g = grad_log_prob[:, None]
        grad_z = p * -g
        grad_z.scatter_add_(-1, targets[:, None], g)
        if masked is not None:  # constant logits (a target among them, which no rollout samples)
            grad_z.index_fill_(-1, masked, 0.0)
    else:
        grad_z = torch.zeros_like(p)
    if grad_entropy is not None:  # in place on log_p, which is not needed after this
        weight_h = log_p.add_(entropy[:, None]).mul_(grad_entropy[:, None])
        grad_z.addcmul_(p, weight_h, value=-1.0)
    del log_p, p
    if inv_temperature != 1.0:
        grad_z *= inv_temperature
    grad_z = grad_z.to(hidden.dtype)
    return (grad_z @ weight if want_hidden else None), ((grad_z.T @ hidden).float() if want_weight else None)


@functools.cache
def _compiled(fn):
    """``fn`` compiled by ``torch.compile``: each chunk's float32 passes over the logits fused into a few kernels
    (sizes dynamic: the last chunk and each micro-batch differ)."""
    return torch.compile(fn, dynamic=True)


class _ChunkedTokenOutputs(torch.autograd.Function):
    """``(hidden [N, H], weight [V, H], targets [N]) -> (log_prob [N], entropy [N], Σp² [N])`` in float32 (the
    ``masked`` tokens out of the softmax); ``fused``: each chunk's steps compiled (``_compiled``)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, inv_temperature: float, flags: tuple[bool, bool, bool],
                masked: torch.Tensor | None):
        need_entropy, need_sum_pi_squared, fused = flags
        step = _compiled(_chunk_forward) if fused else _chunk_forward
        rows = hidden.shape[0]
        chunk = max(1, CHUNK_BYTES // (4 * weight.shape[0]))
        log_prob = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        log_norm = torch.empty_like(log_prob)
        entropy = torch.empty_like(log_prob) if need_entropy else log_prob.new_empty(0)
        sum_sq = torch.empty_like(log_prob) if need_sum_pi_squared else log_prob.new_empty(0)
        for start in range(0, rows, chunk):
            end = min(rows, start + chunk)
            lp, lse, ent, sq = step(hidden[start:end], weight, targets[start:end], inv_temperature, masked,
                                    need_entropy, need_sum_pi_squared)
            log_prob[start:end], log_norm[start:end] = lp, lse
            if need_entropy:
                entropy[start:end] = ent
            if need_sum_pi_squared:
                sum_sq[start:end] = sq
        ctx.save_for_backward(hidden, weight, targets, log_norm, entropy)
        ctx.inv_temperature, ctx.need_entropy, ctx.chunk, ctx.masked = inv_temperature, need_entropy, chunk, masked
        ctx.fused = fused
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(sum_sq)
        return log_prob, entropy, sum_sq

    @staticmethod
    def backward(ctx, grad_log_prob, grad_entropy, _grad_sum_sq):
        hidden, weight, targets, log_norm, entropy = ctx.saved_tensors
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        step = _compiled(_chunk_backward) if ctx.fused else _chunk_backward
        grad_hidden = torch.zeros_like(hidden) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_weight else None
        use_entropy = ctx.need_entropy and grad_entropy is not None
        for start in range(0, hidden.shape[0], ctx.chunk):
            end = min(hidden.shape[0], start + ctx.chunk)
            piece = slice(start, end)
            dh, dw = step(hidden[piece], weight, targets[piece], log_norm[piece],
                          entropy[piece] if use_entropy else None,
                          None if grad_log_prob is None else grad_log_prob[piece],
                          grad_entropy[piece] if use_entropy else None, ctx.inv_temperature, ctx.masked,
                          want_hidden, want_weight)
            if want_hidden:
                grad_hidden[piece] = dh
            if want_weight:
                grad_weight += dw
        if want_weight:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def _liger_log_prob(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                    inv_temperature: float) -> torch.Tensor:
    """log π(target) by liger-kernel's fused linear cross-entropy (Triton; per-token losses, the logits recomputed
    in its backward), the temperature applied to the hidden states (``W (h / T) = (W h) / T``)."""
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    scaled = hidden if inv_temperature == 1.0 else hidden * inv_temperature
    # (input, weight, target, bias, ce_weight, ignore_index, lse_square_scale, label_smoothing, reduction,
    #  softcap, return_z_loss, accum_dtype): float32 accumulation of the weight's gradient over the chunks
    loss = LigerFusedLinearCrossEntropyFunction.apply(scaled, weight, targets, None, None, -100, 0.0, 0.0, "none",
                                                      None, False, torch.float32)[0]
    return -loss


@dataclass
class TokenOutputs:
    """The output layer's per-position results under ``softmax(logits / temperature)``, each ``[N]`` float32."""

    log_prob: torch.Tensor  # log π(target)
    entropy: torch.Tensor | None = None  # H(π); None when not asked for
    sum_pi_squared: torch.Tensor | None = None  # Σ_v π_v²; None when not asked for


def token_outputs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                  need_entropy: bool = False, need_sum_pi_squared: bool = False,
                  masked: torch.Tensor | None = None, head: str = "chunked") -> TokenOutputs:
    """The outputs for ``targets`` ``[N]`` under ``softmax(hidden [N, H] @ weight [V, H].T / temperature)``,
    computed in chunks (see the module docstring); ``masked``: token ids left out of the softmax; ``head``: how
    (:data:`TOKEN_HEADS`)."""
    if head not in TOKEN_HEADS:
        raise ValueError(f"token head {head!r}: expected one of {', '.join(TOKEN_HEADS)}")
    if head == "liger":
        if masked is not None:
            raise ValueError("the liger token head cannot leave tokens out of the softmax (a vision-language "
                             "model's vision tokens): use the chunked or fused head")
        log_prob = _liger_log_prob(hidden, weight, targets, 1.0 / temperature)
        if not (need_entropy or need_sum_pi_squared):
            return TokenOutputs(log_prob)
        # liger computes no entropy: a second pass for it (its log-probs unused, so they get no gradient)
        rest = token_outputs(hidden, weight, targets, temperature, need_entropy, need_sum_pi_squared)
        return TokenOutputs(log_prob, rest.entropy, rest.sum_pi_squared)
    log_prob, entropy, sum_sq = _ChunkedTokenOutputs.apply(
        hidden, weight, targets, 1.0 / temperature, (need_entropy, need_sum_pi_squared, head == "fused"), masked)
    return TokenOutputs(log_prob, entropy if need_entropy else None, sum_sq if need_sum_pi_squared else None)


def _body(causal_lm: torch.nn.Module) -> torch.nn.Module:
    """What computes ``causal_lm``'s last hidden states: its decoder, or a vision-language model's whole body
    (vision encoder and language model: ``model``)."""
    return causal_lm.model if is_vision(causal_lm.config) else causal_lm.get_decoder()


class TokenOutputLM(torch.nn.Module):
    """A causal LM (``model`` = its decoder, ``lm_head`` = its output layer, the very modules of the loaded
    Hugging Face model) whose forward returns :class:`TokenOutputs` at chosen positions instead of logits."""

    def __init__(self, causal_lm: torch.nn.Module, head: str = "chunked"):
        super().__init__()
        self.model, self.lm_head = _body(causal_lm), causal_lm.get_output_embeddings()
        self.config, self.head = causal_lm.config, head  # head: one of TOKEN_HEADS
        # a vision-language model's vision tokens: out of its policy's softmax (rlplat.models.vision)
        self.masked = torch.tensor(vision_token_ids(self.config)) if is_vision(self.config) else None
        self.train(causal_lm.training)

    @staticmethod
    def fits(causal_lm: torch.nn.Module) -> bool:
        """Whether ``causal_lm`` computes its logits as exactly ``lm_head(model(...).last_hidden_state)``: a
        model type known to apply nothing to the output layer's result, made of those two modules only (so
        this class's parameter names are its), the output layer a bias-free linear layer."""
        head = causal_lm.get_output_embeddings()
        return (getattr(causal_lm.config, "model_type", None) in PLAIN_HEAD_MODELS
                and dict(causal_lm.named_children()) == {"model": _body(causal_lm), "lm_head": head}
                and not any(True for _ in causal_lm.named_parameters(recurse=False))
                and not any(True for _ in causal_lm.named_buffers(recurse=False))
                and type(head) is torch.nn.Linear and head.bias is None)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                positions: torch.Tensor, targets: torch.Tensor, temperature: float, need_entropy: bool = False,
                need_sum_pi_squared: bool = False,
                **images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``input_ids``, ``position_ids``, ``attention_mask`` ``[rows, T]`` (no mask: packed rows, see
        :mod:`rlplat.engines.packing`); ``positions`` ``[N]`` index the flattened ``[rows * T]`` positions
        whose next token is ``targets`` ``[N]``. Returns the fields of :class:`TokenOutputs` as a tuple: FSDP2
        hooks the tensors of a tuple output to gather the weights again for the backward pass, and older torch
        releases (2.11) do not look inside a dataclass (the head weight's storage is then freed in backward).
        ``images``: a vision-language model's image inputs (``pixel_values``, ``image_grid_thw``)."""
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False, **images).last_hidden_state
        flat = hidden.reshape(-1, hidden.shape[-1])
        masked = None if self.masked is None else self.masked.to(flat.device)
        out = token_outputs(flat[positions], self.lm_head.weight, targets, temperature, need_entropy,
                            need_sum_pi_squared, masked, self.head)
        return out.log_prob, out.entropy, out.sum_pi_squared
