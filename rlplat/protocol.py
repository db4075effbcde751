"""The batch passed between the controller and the workers.

Where a Batch flows in one step; each arrow passes a Batch, and under each stage are the fields it adds::

    controller ───► rollout ──────────► reward ──────────────► actor / ref / critic ──► controller
    prompts         responses           token_level_scores     old_log_probs           token_level_rewards
    prompt_mask     response_mask                              ref_log_probs           advantages
    uid, raw_prompt input_ids, ...                             values                  returns
    data_source     rollout_log_probs                                                  (then updates the
    ground_truth                                                                       critic and actor)

A :class:`Batch` holds ``B`` rows: per-row tensors in ``tensors`` (a dict of ``[B, ...]`` tensors),
per-row Python objects in ``non_tensors`` (1-D numpy object arrays of length B) and batch-level
``meta`` (temperature, global token counts, step ...), which is copied to every piece and never split.
Every operation returns a new Batch; only :meth:`Batch.pop` changes the batch it is called on. New
Batches share tensor storage with their source (like tensor slicing), so clone before writing into a
tensor in place.

Documented fields (``B`` rows, ``P`` prompt tokens, ``R`` response tokens); the same text is
:data:`FIELDS`, and a test keeps the two identical::

    prompts              [B, P] int64: prompt token ids, left-padded
    prompt_mask          [B, P] int64: 1 on prompt tokens, 0 on left padding
    responses            [B, R] int64: response token ids, right-padded with the pad id
    response_mask        [B, R] int64: 1 on generated tokens up to and including EOS
    input_ids            [B, P+R] int64: prompts and responses concatenated
    attention_mask       [B, P+R] int64: prompt_mask and the attended response tokens concatenated
    position_ids         [B, P+R] int64: positions counting attended tokens only
    routed_experts       [B, P+R, L, k] int16: a mixture of experts' routing in the rollout: each token's experts per sparse layer (-1: none)
    old_routed_experts   [B, P+R, L, k] int16: the same from the actor's log-prob pass (actor.moe.router_replay=r2)
    rollout_log_probs    [B, R] float: log-probs of the sampled tokens from the rollout engine
    old_log_probs        [B, R] float: log-probs under the policy before this step's update
    ref_log_probs        [B, R] float: log-probs under the reference policy
    entropy              [B, R] float: entropy of the policy at each response position
    sum_pi_squared       [B, R] float: sum over the vocabulary of pi(v)^2 (optimal token baselines)
    values               [B, R] float: critic values
    baseline_scores      [B] float: score of the greedy response to the same prompt (ReMax)
    token_level_scores   [B, R] float: reward-function score on the last response token
    token_level_rewards  [B, R] float: scores after the optional KL penalty
    advantages           [B, R] float: advantage estimates (0 on masked tokens)
    returns              [B, R] float: return targets (critic)
    uid                  [B] str: prompt-group id; the n responses to one prompt share it
    data_source          [B] str: dataset name, selects the reward function
    ground_truth         [B] str: reference answer (reward_model.ground_truth)
    extra_info           [B] dict: per-row extras from the dataset
    raw_prompt           [B] list[dict]: the chat messages of the prompt
    response_text        [B] str: what the reward scores when it is not the decoded response (agents: the last assistant message)
    multi_modal_inputs   [B] dict | None: a row's image inputs for a vision-language model (pixel_values, image_grid_thw)

The last seven are non-tensors; the rest are tensors. With a multi-turn agent loop the responses hold the
observation tokens between the turns too: ``attention_mask`` is 1 on them, ``response_mask`` is not.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

FIELDS: dict[str, str] = {
    # tensors
    "prompts": "[B, P] int64: prompt token ids, left-padded",
    "prompt_mask": "[B, P] int64: 1 on prompt tokens, 0 on left padding",
    "responses": "[B, R] int64: response token ids, right-padded with the pad id",
    "response_mask": "[B, R] int64: 1 on generated tokens up to and including EOS",
    "input_ids": "[B, P+R] int64: prompts and responses concatenated",
    "attention_mask": "[B, P+R] int64: prompt_mask and the attended response tokens concatenated",
    "position_ids": "[B, P+R] int64: positions counting attended tokens only",
    "routed_experts": "[B, P+R, L, k] int16: a mixture of experts' routing in the rollout: each token's experts per sparse layer (-1: none)",
    "old_routed_experts": "[B, P+R, L, k] int16: the same from the actor's log-prob pass (actor.moe.router_replay=r2)",
    "rollout_log_probs": "[B, R] float: log-probs of the sampled tokens from the rollout engine",
    "old_log_probs": "[B, R] float: log-probs under the policy before this step's update",
    "ref_log_probs": "[B, R] float: log-probs under the reference policy",
    "entropy": "[B, R] float: entropy of the policy at each response position",
    "sum_pi_squared": "[B, R] float: sum over the vocabulary of pi(v)^2 (optimal token baselines)",
    "values": "[B, R] float: critic values",
    "baseline_scores": "[B] float: score of the greedy response to the same prompt (ReMax)",
    "token_level_scores": "[B, R] float: reward-function score on the last response token",
    "token_level_rewards": "[B, R] float: scores after the optional KL penalty",
    "advantages": "[B, R] float: advantage estimates (0 on masked tokens)",
    "returns": "[B, R] float: return targets (critic)",
    # non-tensors
    "uid": "[B] str: prompt-group id; the n responses to one prompt share it",
    "data_source": "[B] str: dataset name, selects the reward function",
    "ground_truth": "[B] str: reference answer (reward_model.ground_truth)",
    "extra_info": "[B] dict: per-row extras from the dataset",
    "raw_prompt": "[B] list[dict]: the chat messages of the prompt",
    "response_text": "[B] str: what the reward scores when it is not the decoded response (agents: the last assistant message)",
    "multi_modal_inputs": "[B] dict | None: a row's image inputs for a vision-language model (pixel_values, image_grid_thw)",
}
NON_TENSOR_FIELDS = ("uid", "data_source", "ground_truth", "extra_info", "raw_prompt", "response_text",
                     "multi_modal_inputs")


def _object_array(values: Iterable[Any]) -> np.ndarray:
    """A 1-D object array of ``values``; np.array would turn a list of equal-length lists into 2-D."""
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        return values
    values = list(values)
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def _row_index(index: Any, length: int) -> slice | torch.Tensor:
    """int / slice / index list, array or LongTensor / bool mask -> a slice or 1-D CPU LongTensor."""
    if isinstance(index, slice):
        return index
    if isinstance(index, torch.Tensor) and index.dim() == 0 and not index.is_floating_point():
        index = index if index.dtype == torch.bool else int(index)  # a 0-d bool is no row number
    if isinstance(index, numbers.Integral) and not isinstance(index, bool):
        if not -length <= index < length:
            raise IndexError(f"row {index} is out of range for a Batch of {length} rows")
        return slice(index % length, index % length + 1)  # a slice keeps the batch dimension
    if isinstance(index, (list, tuple, np.ndarray)):
        array = np.asarray(index)
        index = torch.as_tensor(array if array.size else array.astype(np.int64))  # [] is float64
    if not isinstance(index, torch.Tensor) or index.dim() != 1:
        raise TypeError(f"cannot index a Batch with {index!r}; use an int, slice, 1-D index or bool mask")
    index = index.cpu()  # numpy indexes the non-tensors with it
    if index.dtype == torch.bool:
        if len(index) != length:
            raise IndexError(f"bool mask has {len(index)} entries, the Batch has {length} rows")
        return index.nonzero().squeeze(-1)
    if index.is_floating_point() or index.is_complex():
        raise TypeError(f"row indices must be integers, got dtype {index.dtype}")
    return index.long()


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and values; NaN equals NaN (torch.equal alone would say they differ)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        a_nan, b_nan = a.isnan(), b.isnan()
        return torch.equal(a_nan, b_nan) and torch.equal(a.masked_fill(a_nan, 0), b.masked_fill(b_nan, 0))
    return bool(torch.equal(a, b))


def _same_objects(a: np.ndarray, b: np.ndarray) -> bool:
    """Element-wise equality of two object columns; elements may be arrays (np == gives an array), or dicts of
    them (a row's image inputs)."""
    def same(x: Any, y: Any) -> bool:
        if x is y:
            return True
        if isinstance(x, (np.ndarray, torch.Tensor)) or isinstance(y, (np.ndarray, torch.Tensor)):
            return np.array_equal(np.asarray(x), np.asarray(y))
        if isinstance(x, dict) and isinstance(y, dict):
            return x.keys() == y.keys() and all(same(x[key], y[key]) for key in x)
        return bool(x == y)

    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


@dataclass(eq=False)  # field-wise == would compare tensors and arrays, whose == is element-wise
class Batch:
    """``B`` rows: tensors ``[B, ...]`` and object columns by name, and shared meta. ``size`` (B) comes
    from the fields when not given; a Batch without fields needs it.

    The tensors are a plain dict rather than a ``TensorDict``: a Batch only ever indexes, selects and
    concatenates rows, and importing tensordict costs every process that handles batches memory and
    start-up time (it loads torch's compiler stack), the controller included."""

    tensors: dict[str, torch.Tensor]
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    size: int | None = None

    def __post_init__(self) -> None:
        for key, value in self.tensors.items():
            if value.dim() == 0:
                raise ValueError(f"tensor {key!r} is a scalar; a Batch's tensors are [B, ...]")
        if self.size is None:
            if not self.tensors and not self.non_tensors:
                raise ValueError("a Batch without fields needs its size")
            first = next(iter(self.tensors.values()), None)
            self.size = len(next(iter(self.non_tensors.values()))) if first is None else first.shape[0]
        for key, value in self.tensors.items():
            if value.shape[0] != self.size:
                raise ValueError(f"tensor {key!r} has shape {list(value.shape)}, expected [{self.size}, ...]")
        for key, column in self.non_tensors.items():
            if len(column) != self.size:
                raise ValueError(f"non-tensor {key!r} has {len(column)} rows, expected {self.size}")

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Iterable[Any]] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Batch:
        """Build a Batch, checking that every tensor (first dim) and column has the same length B.

        Non-tensor columns (lists, tuples, arrays) become 1-D object arrays, also lists of dicts/lists.
        """
        tensors = dict(tensors or {})
        for key, value in tensors.items():
            if not isinstance(value, torch.Tensor) or value.dim() == 0:
                raise ValueError(f"tensor field {key!r} must be a tensor of shape [B, ...], got {value!r}")
        for key, value in (non_tensors or {}).items():
            if isinstance(value, (str, bytes, dict)) or not isinstance(value, Iterable):
                raise ValueError(f"non-tensor field {key!r} must be a sequence of B values, got {value!r}")
        columns = {k: _object_array(v) for k, v in (non_tensors or {}).items()}
        lengths = {k: v.shape[0] for k, v in tensors.items()} | {k: len(v) for k, v in columns.items()}
        if not lengths:
            raise ValueError("a Batch needs at least one tensor or non-tensor field")
        first_key, size = next(iter(lengths.items()))
        for key, length in lengths.items():
            if length != size:
                raise ValueError(f"field {key!r} has {length} rows, expected {size} (as {first_key!r})")
        return cls(tensors, columns, dict(meta or {}), size)

    # ------------------------------------------------------------------ size and access
    def __len__(self) -> int:
        return self.size

    @property
    def batch_size(self) -> int:
        """B, the number of rows (sequences, not prompts)."""
        return len(self)

    def keys(self) -> tuple[list[str], list[str]]:
        """(tensor keys, non-tensor keys)."""
        return list(self.tensors.keys()), list(self.non_tensors)

    def _with(self, tensors: dict[str, torch.Tensor], non_tensors: dict[str, np.ndarray], size: int) -> Batch:
        """A new Batch of these fields carrying a copy of this batch's meta."""
        return Batch(tensors, non_tensors, dict(self.meta), size)

    def __getitem__(self, index: Any) -> Batch:
        """Rows by int (a Batch of 1 row), slice, index list/array/LongTensor or bool mask [B]."""
        rows = _row_index(index, len(self))
        np_rows = rows.numpy() if isinstance(rows, torch.Tensor) else rows
        size = len(rows) if isinstance(rows, torch.Tensor) else len(range(len(self))[rows])
        return self._with({k: v[rows] for k, v in self.tensors.items()},
                          {k: _object_array(v[np_rows]) for k, v in self.non_tensors.items()}, size)

    def _check_keys(
        self, tensor_keys: Sequence[str] | None, non_tensor_keys: Sequence[str] | None
    ) -> tuple[list[str], list[str]]:
        """Resolve None to all keys; KeyError naming the first unknown key and the available ones."""
        t_keys = list(self.tensors.keys()) if tensor_keys is None else list(tensor_keys)
        n_keys = list(self.non_tensors) if non_tensor_keys is None else list(non_tensor_keys)
        for key in t_keys:
            if key not in self.tensors.keys():
                raise KeyError(f"no tensor field {key!r}; available: {sorted(self.tensors.keys())}")
        for key in n_keys:
            if key not in self.non_tensors:
                raise KeyError(f"no non-tensor field {key!r}; available: {sorted(self.non_tensors)}")
        return t_keys, n_keys

    def select(self, tensor_keys: Sequence[str] | None = None, non_tensor_keys: Sequence[str] | None = None) -> Batch:
        """A Batch with only the named fields (None = all fields of that kind)."""
        t_keys, n_keys = self._check_keys(tensor_keys, non_tensor_keys)
        return self._with({k: self.tensors[k] for k in t_keys}, {k: self.non_tensors[k] for k in n_keys}, len(self))

    def pop(self, tensor_keys: Sequence[str] = (), non_tensor_keys: Sequence[str] = ()) -> Batch:
        """Remove the named fields from this batch (mutates it) and return them as a new Batch.

        All keys are checked before anything is removed, so a KeyError leaves this batch whole.
        """
        out = self.select(list(tensor_keys), list(non_tensor_keys))
        for key in tensor_keys:
            del self.tensors[key]
        for key in non_tensor_keys:
            del self.non_tensors[key]
        return out

    def union(self, other: Batch) -> Batch:
        """This batch's fields plus ``other``'s. A field in both must hold equal values (it is the same
        data coming back from a worker); meta is merged, this batch's values winning."""
        if len(self) != len(other):
            raise ValueError(f"cannot union batches of {len(self)} and {len(other)} rows")
        tensors = dict(self.tensors)  # new container, same tensors
        for key, value in other.tensors.items():
            if key in tensors and not _same_tensor(tensors[key], value):
                raise ValueError(f"union: tensor field {key!r} differs between the two batches")
            tensors[key] = value
        non_tensors = dict(self.non_tensors)
        for key, value in other.non_tensors.items():
            if key in non_tensors and not _same_objects(non_tensors[key], value):
                raise ValueError(f"union: non-tensor field {key!r} differs between the two batches")
            non_tensors[key] = value
        return Batch(tensors, non_tensors, {**other.meta, **self.meta}, len(self))

    # ------------------------------------------------------------------ split and join
    def split(self, size: int) -> list[Batch]:
        """Consecutive pieces of ``size`` rows (the last may be shorter)."""
        if size < 1:
            raise ValueError(f"split size must be >= 1, got {size}")
        return [self[start : start + size] for start in range(0, len(self), size)]

    def chunk(self, n: int) -> list[Batch]:
        """``n`` equal consecutive pieces; B must divide by n (pad first with :meth:`pad_to_divisor`)."""
        if n < 1:
            raise ValueError(f"chunk count must be >= 1, got {n}")
        if len(self) % n:
            raise ValueError(f"cannot chunk {len(self)} rows into {n} equal pieces; use pad_to_divisor({n}) first")
        return [self[i * (len(self) // n) : (i + 1) * (len(self) // n)] for i in range(n)]

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Rows of all batches in order. All must have the same fields, and each tensor field the same
        shape after the batch dim. Meta is taken from the first batch (the others' meta is ignored)."""
        if not batches:
            raise ValueError("concat needs at least one batch")
        first = batches[0]
        keys = (sorted(first.tensors.keys()), sorted(first.non_tensors))
        for i, b in enumerate(batches[1:], 1):
            if (sorted(b.tensors.keys()), sorted(b.non_tensors)) != keys:
                raise ValueError(f"concat: batch {i} has fields {b.keys()}, batch 0 has {first.keys()}")
            for key in keys[0]:
                if b.tensors[key].shape[1:] != first.tensors[key].shape[1:]:
                    raise ValueError(
                        f"concat: tensor field {key!r} has shape {list(b.tensors[key].shape)} in batch {i}, "
                        f"{list(first.tensors[key].shape)} in batch 0 (all but the first dim must match)"
                    )
        tensors = {k: torch.cat([b.tensors[k] for b in batches]) for k in first.tensors}
        non_tensors = {k: _object_array(np.concatenate([b.non_tensors[k] for b in batches])) for k in keys[1]}
        return first._with(tensors, non_tensors, sum(len(b) for b in batches))

    def repeat(self, n: int, interleave: bool = True) -> Batch:
        """Each row ``n`` times: interleaved [a, a, b, b] (a prompt's samples adjacent) or tiled
        [a, b, a, b]. Repeated object rows are the same Python object, not copies."""
        if n < 1:
            raise ValueError(f"repeat count must be >= 1, got {n}")
        rows = torch.arange(len(self))
        return self[rows.repeat_interleave(n) if interleave else rows.repeat(n)]

    def pad_to_divisor(self, divisor: int) -> tuple[Batch, int]:
        """Append rows copied from the start until B divides by ``divisor``; return (padded, pad size).

        Copies of real rows, not zeros: a padded row is a valid input, so no worker sees an all-masked
        row (whose mean over zero tokens would be NaN). Undo with :meth:`unpad`.
        """
        if divisor < 1:
            raise ValueError(f"divisor must be >= 1, got {divisor}")
        pad = -len(self) % divisor  # 0 for an empty batch, which has no rows to copy
        return self[torch.arange(len(self) + pad) % max(len(self), 1)], pad

    def unpad(self, pad: int) -> Batch:
        """Drop the last ``pad`` rows (the ones :meth:`pad_to_divisor` added)."""
        if not 0 <= pad <= len(self):
            raise ValueError(f"pad size must be in [0, {len(self)}] for a Batch of {len(self)} rows, got {pad}")
        return self[: len(self) - pad]

    def to(self, device: torch.device | str) -> Batch:
        """Tensors moved to ``device``; non-tensors and meta stay on the host."""
        return self._with({k: v.to(device) for k, v in self.tensors.items()}, dict(self.non_tensors), len(self))

    # ------------------------------------------------------------------ pickling (Ray calls, processes)
    def __reduce__(self):
        """Pickle each CPU tensor as a numpy byte array of its own elements, with its dtype and shape.

        torch pickles a tensor through its whole storage (a row slice sends every row) and serialises each
        storage on its own; a numpy array is pickled in one copy, and a protocol-5 pickler (Ray's) passes it
        out of band, so a worker call with a step's batch takes about half the time (benchmarks/ray_calls.py).
        Tensors on another device keep torch's pickling."""
        packed, other = {}, {}
        for key, value in self.tensors.items():
            if value.device.type == "cpu":  # bytes, so that every dtype (bf16 too) has a numpy form
                packed[key] = (value.detach().contiguous().reshape(-1).view(torch.uint8).numpy(), value.dtype,
                               tuple(value.shape))
            else:
                other[key] = value
        return _unpickle_batch, (len(self), list(self.tensors.keys()), packed, other, self.non_tensors, self.meta)

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {list(v.shape)} {v.dtype}" for k, v in self.tensors.items())
        return (
            f"Batch(B={len(self)}, tensors={{{tensors}}}, non_tensors={list(self.non_tensors)}, "
            f"meta={sorted(self.meta)})"
        )


def _unpickle_batch(size: int, order: list, packed: dict, other: dict, non_tensors: dict, meta: dict) -> Batch:
    """Inverse of :meth:`Batch.__reduce__`, in the sender's key order. Each tensor gets a writable copy: a
    received array may be a read-only view of the message."""
    tensors = {key: torch.from_numpy(data.copy()).view(dtype).view(shape)
               for key, (data, dtype, shape) in packed.items()}
    tensors.update(other)
    return Batch({key: tensors[key] for key in order}, non_tensors, meta, size)
