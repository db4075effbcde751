"""The forward passes the Hugging Face rollout engine samples with: the model's own, or a short one for
dense Qwen2 / Llama models.

Both have one interface (:class:`Forward`): ``start`` runs the prompts and returns the logits that pick
each row's first token, ``step`` feeds one token per row and returns the next logits, ``keep`` drops the
rows that have stopped. DenseForward can also start from rows' caches kept from an earlier call
(:class:`KeptCache`, taken with ``row_cache``), so that a conversation's next turn runs only its new
tokens. :class:`ModelForward` calls the model (``transformers``' forward and its
cache). :class:`DenseForward` computes the same thing in a few dozen tensor operations per token over the
model's own weight tensors (so it follows in-place updates and shared weights), with a preallocated
key/value cache. At the sizes the engine serves, transformers' forward spends more time in Python than in
arithmetic: 64 rows x 16 tokens of a 0.3M-parameter Qwen2 take 27 ms through it and 15 ms here
(docs/performance.md).

DenseForward takes only what it computes exactly as the model does (:meth:`DenseForward.of`): Qwen2 and
Llama, SiLU MLPs, full attention, rotary embeddings whose frequencies do not depend on the sequence
length; and the engine compares its logits with the model's forward before using it
(:func:`matches_model`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # frequencies fixed in advance (not "dynamic", "longrope")


@dataclass
class KeptCache:
    """The keys and values of earlier tokens for a batch of rows: ``k``, ``v`` ``[layers, B, kv_heads, width,
    head_dim]``, ``valid`` ``[B, width]`` marking each row's tokens (right-aligned, in order)."""

    k: torch.Tensor
    v: torch.Tensor
    valid: torch.Tensor

    @classmethod
    def of_rows(cls, rows: list[tuple[torch.Tensor, torch.Tensor] | None], like: torch.Tensor) -> KeptCache:
        """One batch from per-row ``(k, v)`` ``[layers, kv_heads, n, head_dim]`` (None: a row with nothing
        kept), each right-aligned; ``like`` gives the shape of a row's entry, its dtype and device."""
        width = max((k.shape[2] for k, _ in filter(None, rows)), default=0)
        layers, heads, _, dim = like.shape
        k = like.new_zeros(layers, len(rows), heads, width, dim)
        v, valid = torch.zeros_like(k), torch.zeros(len(rows), width, dtype=torch.bool, device=like.device)
        for row, entry in enumerate(rows):
            if entry is not None and entry[0].shape[2]:
                n = entry[0].shape[2]
                k[:, row, :, width - n:], v[:, row, :, width - n:] = entry
                valid[row, width - n:] = True
        return cls(k, v, valid)


class Forward:
    """Prompt and per-token forward passes with a cache (see the module docstring)."""

    def start(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, new_tokens: int,
              kept: KeptCache | None = None, images: dict | None = None) -> torch.Tensor:
        """Run left-padded prompts ``ids`` ``[B, P]`` (``mask`` marks real tokens, ``positions`` their
        position ids, ``[B, P]``, or ``[B, P, 3]`` for a vision-language model) with room for ``new_tokens``
        more; the last position's logits ``[B, V]``. ``kept``: the rows' earlier tokens, which ``ids`` follow
        (only a forward that can say so takes it); ``images``: the prompts' image inputs (the model's forward)."""
        raise NotImplementedError

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``[B]``, at position ids ``[B]``, or ``[B, 3]``); the logits ``[B, V]`` after it."""
        raise NotImplementedError

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices into the current rows) in the cache."""
        raise NotImplementedError

    def release(self) -> None:
        """Drop the cache (the next ``start`` builds a new one)."""
        raise NotImplementedError


class ModelForward(Forward):
    """The model's own forward with its cache (any architecture transformers runs)."""

    def __init__(self, model: torch.nn.Module):
        import inspect

        self.model = model
        # the KV cache's argument: ``cache`` in recent transformers, ``past_key_values`` before
        args = inspect.signature(type(model).forward).parameters
        self._cache_argument = "cache" if "cache" in args else "past_key_values"
        self._last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in args else {}

    def start(self, ids, mask, positions, new_tokens, kept=None, images=None):
        if kept is not None:
            raise ValueError("the model's own forward does not start from a kept cache")
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=_as_model_takes(positions), use_cache=True,
                         **self._last_logits_only, **(images or {}))
        self.cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        self.mask = mask
        return out.logits[:, -1]

    def step(self, tokens, positions):
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(tokens), 1)], dim=1)
        out = self.model(input_ids=tokens[:, None], attention_mask=self.mask,
                         position_ids=_as_model_takes(positions[:, None]), use_cache=True,
                         **{self._cache_argument: self.cache})
        return out.logits[:, -1]

    def keep(self, rows):
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]

    def release(self):
        self.cache = self.mask = None


class DenseForward(Forward):
    """A dense Qwen2 / Llama decoder's forward over the model's own weights, with a preallocated cache."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        config = model.config
        self.layers = model.model.layers
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = self.layers[0].self_attn.head_dim

    @classmethod
    def of(cls, model: torch.nn.Module) -> DenseForward | None:
        """A DenseForward for ``model``, or None when its architecture is not one it computes exactly."""
        config = model.config
        rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
        if (config.model_type not in ("qwen2", "llama") or getattr(config, "hidden_act", None) != "silu"
                or getattr(config, "use_sliding_window", False) or rotary is None
                or getattr(rotary, "rope_type", "default") not in ROPE_TYPES
                or getattr(config, "pretraining_tp", 1) != 1):
            return None
        return cls(model)

    def _norm(self, norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The model's RMSNorm: normalised in float32, back in x's dtype, then scaled."""
        return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=norm.variance_epsilon).to(x.dtype)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        """The new tokens ``ids`` ``[B, T]`` at ``positions``, written into the cache after ``self.length``
        tokens; ``attend`` ``[B, 1, T, length + T]`` says which keys each query sees. The last position's logits."""
        rows, new = ids.shape
        end = self.length + new
        x = self.model.model.embed_tokens(ids)
        cos, sin = self.model.model.rotary_emb(x, positions)  # [B, T, head_dim], as the model computes them
        cos, sin = cos[:, None], sin[:, None]
        for index, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h = self._norm(layer.input_layernorm, x)
            q = attn.q_proj(h).view(rows, new, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(rows, new, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(rows, new, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            self.k[index, :, :, self.length:end] = k
            self.v[index, :, :, self.length:end] = v
            a = F.scaled_dot_product_attention(q, self.k[index, :, :, :end], self.v[index, :, :, :end],
                                               attn_mask=attend, scale=attn.scaling, enable_gqa=True)
            x = x + attn.o_proj(a.transpose(1, 2).reshape(rows, new, -1))
            h = self._norm(layer.post_attention_layernorm, x)
            x = x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
        self.length = end
        return self.model.lm_head(self._norm(self.model.model.norm, x[:, -1]))

    def start(self, ids, mask, positions, new_tokens, kept=None, images=None):
        """As :meth:`Forward.start` (a dense decoder: no ``images``); with ``kept``, the rows' earlier tokens come from it (``positions`` then
        continue theirs) and only ``ids`` run."""
        rows, prompt = ids.shape
        held = 0 if kept is None else kept.valid.shape[1]  # the kept tokens' width (the rows right-aligned)
        weight = self.model.model.embed_tokens.weight
        shape = (len(self.layers), rows, self.kv_heads, held + prompt + new_tokens, self.head_dim)
        self.k = torch.empty(shape, dtype=weight.dtype, device=weight.device)
        self.v = torch.empty_like(self.k)
        self.valid = torch.ones(rows, held + prompt + new_tokens, dtype=torch.bool, device=ids.device)
        if kept is not None:
            self.k[:, :, :, :held], self.v[:, :, :, :held], self.valid[:, :held] = kept.k, kept.v, kept.valid
        self.valid[:, held:held + prompt] = mask.bool()  # left padding is never attended to
        self.length = held
        causal = torch.ones(prompt, held + prompt, dtype=torch.bool, device=ids.device).tril(held)
        # a padding position sees itself: a query that sees nothing would make NaNs (its output is unused)
        itself = F.pad(torch.eye(prompt, dtype=torch.bool, device=ids.device), (held, 0))
        attend = (causal & self.valid[:, None, :held + prompt]) | itself
        return self._forward(ids, positions, attend[:, None])

    def row_cache(self, row: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of current row ``row``'s first ``tokens`` tokens (its kept ones, its prompt's
        and those fed since), copied (indexing by positions copies): ``[layers, kv_heads, tokens, head_dim]`` each."""
        where = self.valid[row, :self.length].nonzero().squeeze(-1)[:tokens]
        return self.k[:, row, :, where], self.v[:, row, :, where]

    def step(self, tokens, positions):
        return self._forward(tokens[:, None], positions[:, None], self.valid[:, None, None, : self.length + 1])

    def keep(self, rows):
        self.k, self.v, self.valid = self.k[:, rows], self.v[:, rows], self.valid[rows]

    def release(self):
        self.k = self.v = self.valid = None


def _as_model_takes(positions: torch.Tensor) -> torch.Tensor:
    """Position ids ``[B, T]``, or ``[B, T, 3]`` (a vision-language model's), as the model's forward takes them."""
    return positions.permute(2, 0, 1) if positions.dim() == 3 else positions


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding as the model applies it: x cos + rotate_half(x) sin."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


@torch.no_grad()
def matches_model(forward: Forward, model: torch.nn.Module, tolerance: float) -> float | None:
    """None when ``forward`` gives the model's logits within ``tolerance`` on a short left-padded batch
    (prompt, then three tokens); else the largest difference."""
    from rlplat.sequence import position_ids_from_mask

    vocab = model.config.vocab_size
    device = model.model.embed_tokens.weight.device
    ids = (torch.arange(3 * 9, device=device).reshape(3, 9) * 7 + 3) % vocab
    mask = torch.ones_like(ids)
    mask[1, :2] = mask[2, :4] = 0  # two left-padded rows
    prompt = 6
    positions = position_ids_from_mask(mask)
    expected = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    got = [forward.start(ids[:, :prompt], mask[:, :prompt], positions[:, :prompt], 3)]
    got += [forward.step(ids[:, i], positions[:, i]) for i in range(prompt, 9)]
    forward.release()
    gap = (torch.stack(got, 1) - expected[:, prompt - 1:]).abs().max().item()
    return None if gap <= tolerance else gap
