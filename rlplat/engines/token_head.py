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

:class:`TokenOutputHead` puts this behind the model's own ``lm_head``: its class is swapped in place (the
weight, its name and any tie to the input embedding stay as they are), it acts as the plain linear layer
until a request is set, and then returns the per-position outputs in place of logits. Running inside the
model's forward keeps FSDP's parameter gathering and gradient hooks exactly as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: model types whose causal-LM forward applies nothing to ``lm_head``'s output (no soft-capping or scaling)
PLAIN_HEAD_MODELS = frozenset({
    "llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mistral", "mixtral", "olmo2", "phi3", "smollm3",
})
CHUNK_BYTES = 256 * 2**20  # float32 logits per chunk


class _ChunkedTokenOutputs(torch.autograd.Function):
    """``(hidden [N, H], weight [V, H], targets [N]) -> (log_prob [N], entropy [N], Σp² [N])`` in float32."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, inv_temperature: float, flags: tuple[bool, bool]):
        need_entropy, need_sum_pi_squared = flags
        rows = hidden.shape[0]
        chunk = max(1, CHUNK_BYTES // (4 * weight.shape[0]))
        log_prob = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        log_norm = torch.empty_like(log_prob)
        entropy = torch.empty_like(log_prob) if need_entropy else log_prob.new_empty(0)
        sum_sq = torch.empty_like(log_prob) if need_sum_pi_squared else log_prob.new_empty(0)
        for start in range(0, rows, chunk):
            end = min(rows, start + chunk)
            z = (hidden[start:end] @ weight.T).float() * inv_temperature
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
        ctx.inv_temperature, ctx.need_entropy, ctx.chunk = inv_temperature, need_entropy, chunk
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
            z = (h @ weight.T).float() * ctx.inv_temperature
            log_p = z - log_norm[start:end, None]
            p = log_p.exp()
            grad_z = torch.zeros_like(z)
            if grad_log_prob is not None:
                g = grad_log_prob[start:end, None]
                grad_z -= p * g
                grad_z.scatter_add_(-1, targets[start:end, None], g)
            if use_entropy:
                grad_z -= p * (log_p + entropy[start:end, None]) * grad_entropy[start:end, None]
            grad_z = (grad_z * ctx.inv_temperature).to(hidden.dtype)
            if want_hidden:
                grad_hidden[start:end] = grad_z @ weight
            if want_weight:
                grad_weight += (grad_z.T @ h).float()
        if want_weight:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None


def token_outputs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                  need_entropy: bool = False, need_sum_pi_squared: bool = False):
    """``(log_prob, entropy or None, Σp² or None)`` of ``targets`` ``[N]`` under
    ``softmax(hidden @ weight.T / temperature)``, all ``[N]`` float32 (see the module docstring)."""
    log_prob, entropy, sum_sq = _ChunkedTokenOutputs.apply(hidden, weight, targets, 1.0 / temperature,
                                                          (need_entropy, need_sum_pi_squared))
    return log_prob, entropy if need_entropy else None, sum_sq if need_sum_pi_squared else None


@dataclass
class HeadRequest:
    """What :class:`TokenOutputHead` computes on its next call."""

    flat_index: torch.Tensor  # [N] positions in the flattened [rows * T] hidden states
    targets: torch.Tensor  # [N]
    temperature: float
    need_entropy: bool
    need_sum_pi_squared: bool


class TokenOutputHead(torch.nn.Linear):
    """An ``lm_head`` (bias-free ``nn.Linear``) that, while ``request`` is set, returns ``[rows, T, 3]``
    float32 (log-prob, entropy, Σp² at the requested positions; 0 elsewhere) instead of logits."""

    request: HeadRequest | None = None

    @classmethod
    def install(cls, model: torch.nn.Module) -> TokenOutputHead | None:
        """Turn ``model``'s output layer into this class in place; None when the model is not known to use
        its ``lm_head`` output unchanged (then the caller computes from full logits)."""
        head = model.get_output_embeddings()
        if getattr(model.config, "model_type", None) not in PLAIN_HEAD_MODELS:
            return None
        if type(head) is not torch.nn.Linear or head.bias is not None:
            return None
        head.__class__ = cls
        return head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        request = self.request
        if request is None:
            return super().forward(hidden)
        rows, width = hidden.shape[:2]
        flat = hidden.reshape(rows * width, hidden.shape[-1])
        index = request.flat_index.to(hidden.device)
        log_prob, entropy, sum_sq = token_outputs(flat[index], self.weight, request.targets.to(hidden.device),
                                                  request.temperature, request.need_entropy,
                                                  request.need_sum_pi_squared)
        columns = [log_prob, entropy if entropy is not None else torch.zeros_like(log_prob),
                   sum_sq if sum_sq is not None else torch.zeros_like(log_prob)]
        out = torch.zeros(rows, width, 3, dtype=torch.float32, device=hidden.device)  # not a view: FSDP
        return out.index_put((index // width, index % width), torch.stack(columns, dim=-1))  # hooks the output
