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

from dataclasses import dataclass

import torch

from rlplat.models.vision import is_vision, vision_token_ids

#: model types whose causal-LM forward applies nothing to ``lm_head``'s output (no soft-capping or scaling)
PLAIN_HEAD_MODELS = frozenset({
    "llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mistral", "mixtral", "olmo2", "phi3", "smollm3",
    "qwen2_vl", "qwen2_5_vl", "qwen3_vl",
})
CHUNK_BYTES = 256 * 2**20  # float32 logits per chunk


def _scaled_logits(hidden: torch.Tensor, weight: torch.Tensor, inv_temperature: float,
                   masked: torch.Tensor | None) -> torch.Tensor:
    """``(hidden @ weight.T) / T`` in float32 (no pass over the logits for the scaling at T = 1), the ``masked``
    tokens' at -1e9 (out of the softmax: a vision-language model's vision tokens, rlplat.models.vision)."""
    z = (hidden @ weight.T).float()
    z = z if inv_temperature == 1.0 else z.mul_(inv_temperature)
    return z if masked is None else z.index_fill_(-1, masked, -1e9)


class _ChunkedTokenOutputs(torch.autograd.Function):
    """``(hidden [N, H], weight [V, H], targets [N]) -> (log_prob [N], entropy [N], Σp² [N])`` in float32 (the
    ``masked`` tokens out of the softmax)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, inv_temperature: float, flags: tuple[bool, bool],
                masked: torch.Tensor | None):
        need_entropy, need_sum_pi_squared = flags
        rows = hidden.shape[0]
        chunk = max(1, CHUNK_BYTES // (4 * weight.shape[0]))
        log_prob = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        log_norm = torch.empty_like(log_prob)
        entropy = torch.empty_like(log_prob) if need_entropy else log_prob.new_empty(0)
        sum_sq = torch.empty_like(log_prob) if need_sum_pi_squared else log_prob.new_empty(0)
        for start in range(0, rows, chunk):
            end = min(rows, start + chunk)
            z = _scaled_logits(hidden[start:end], weight, inv_temperature, masked)
            lse = torch.logsumexp(z, dim=-1)
            log_norm[start:end] = lse
            log_prob[start:end] = z.gather(-1, targets[start:end, None]).squeeze(-1) - lse
            if need_entropy or need_sum_pi_squared:
                p = torch.exp(z - lse[:, None])
                if need_entropy:
                    entropy[start:end] = lse - torch.linalg.vecdot(p, z)
                if need_sum_pi_squared:
                    sum_sq[start:end] = p.square().sum(-1)
        ctx.save_for_backward(hidden, weight, targets, log_norm, entropy)
        ctx.inv_temperature, ctx.need_entropy, ctx.chunk, ctx.masked = inv_temperature, need_entropy, chunk, masked
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(sum_sq)
        return log_prob, entropy, sum_sq

    @staticmethod
    def backward(ctx, grad_log_prob, grad_entropy, _grad_sum_sq):
        hidden, weight, targets, log_norm, entropy = ctx.saved_tensors
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.zeros_like(hidden) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_weight else None
        use_entropy = ctx.need_entropy and grad_entropy is not None
        for start in range(0, hidden.shape[0], ctx.chunk):
            end = min(hidden.shape[0], start + ctx.chunk)
            h = hidden[start:end]
            z = _scaled_logits(h, weight, ctx.inv_temperature, ctx.masked)
            log_p = z - log_norm[start:end, None]
            p = log_p.exp()
            del z
            if grad_log_prob is not None:
                g = grad_log_prob[start:end, None]
                grad_z = p * -g
                grad_z.scatter_add_(-1, targets[start:end, None], g)
                if ctx.masked is not None:  # constant logits (a target among them, which no rollout samples)
                    grad_z.index_fill_(-1, ctx.masked, 0.0)
            else:
                grad_z = torch.zeros_like(p)
            if use_entropy:  # in place on log_p, which is not needed after this
                weight_h = log_p.add_(entropy[start:end, None]).mul_(grad_entropy[start:end, None])
                grad_z.addcmul_(p, weight_h, value=-1.0)
            del log_p, p
            if ctx.inv_temperature != 1.0:
                grad_z *= ctx.inv_temperature
            grad_z = grad_z.to(hidden.dtype)
            if want_hidden:
                grad_hidden[start:end] = grad_z @ weight
            if want_weight:
                grad_weight += (grad_z.T @ h).float()
        if want_weight:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


@dataclass
class TokenOutputs:
    """The output layer's per-position results under ``softmax(logits / temperature)``, each ``[N]`` float32."""

    log_prob: torch.Tensor  # log π(target)
    entropy: torch.Tensor | None = None  # H(π); None when not asked for
    sum_pi_squared: torch.Tensor | None = None  # Σ_v π_v²; None when not asked for


def token_outputs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                  need_entropy: bool = False, need_sum_pi_squared: bool = False,
                  masked: torch.Tensor | None = None) -> TokenOutputs:
    """The outputs for ``targets`` ``[N]`` under ``softmax(hidden [N, H] @ weight [V, H].T / temperature)``,
    computed in chunks (see the module docstring); ``masked``: token ids left out of the softmax."""
    log_prob, entropy, sum_sq = _ChunkedTokenOutputs.apply(hidden, weight, targets, 1.0 / temperature,
                                                          (need_entropy, need_sum_pi_squared), masked)
    return TokenOutputs(log_prob, entropy if need_entropy else None, sum_sq if need_sum_pi_squared else None)


def _body(causal_lm: torch.nn.Module) -> torch.nn.Module:
    """What computes ``causal_lm``'s last hidden states: its decoder, or a vision-language model's whole body
    (vision encoder and language model: ``model``)."""
    return causal_lm.model if is_vision(causal_lm.config) else causal_lm.get_decoder()


class TokenOutputLM(torch.nn.Module):
    """A causal LM (``model`` = its decoder, ``lm_head`` = its output layer, the very modules of the loaded
    Hugging Face model) whose forward returns :class:`TokenOutputs` at chosen positions instead of logits."""

    def __init__(self, causal_lm: torch.nn.Module):
        super().__init__()
        self.model, self.lm_head = _body(causal_lm), causal_lm.get_output_embeddings()
        self.config = causal_lm.config
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
                            need_sum_pi_squared, masked)
        return out.log_prob, out.entropy, out.sum_pi_squared
