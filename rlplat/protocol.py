"""The batch passed between the controller and the workers.

    controller: prompts ──► rollout (generate) ──► reward ──► actor / ref / critic (log-probs, values)
                  ▲                                                              │
                  └──────────── advantages, update metrics ◄────────────────────┘

A :class:`Batch` holds per-row tensors in a ``tensordict.TensorDict`` (first dim = rows), per-row Python
objects in ``non_tensors`` (1-D numpy object arrays) and batch-level ``meta`` (copied, never split).
Every operation returns a new Batch; only :meth:`Batch.pop` changes the batch it is called on.

Documented fields (``B`` rows, ``P`` prompt tokens, ``R`` response tokens):
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

FIELDS: dict[str, str] = {
    # tensors
    "prompts": "[B, P] int64: prompt token ids, left-padded",
    "prompt_mask": "[B, P] int64: 1 on prompt tokens, 0 on left padding",
    "responses": "[B, R] int64: response token ids, right-padded with the pad id",
    "response_mask": "[B, R] int64: 1 on generated tokens up to and including EOS",
    "input_ids": "[B, P+R] int64: prompts and responses concatenated",
    "attention_mask": "[B, P+R] int64: prompt_mask and response_mask concatenated",
    "position_ids": "[B, P+R] int64: positions counting attended tokens only",
    "rollout_log_probs": "[B, R] float: log-probs of the sampled tokens from the rollout engine",
    "old_log_probs": "[B, R] float: log-probs under the policy before this step's update",
    "ref_log_probs": "[B, R] float: log-probs under the reference policy",
    "entropy": "[B, R] float: entropy of the policy at each response position",
    "values": "[B, R] float: critic values",
    "baseline_scores": "[B] float: score of the greedy response to the same prompt (ReMax)",
    "token_level_scores": "[B, R] float: reward-function score on the last response token",
    "token_level_rewards": "[B, R] float: scores after the optional KL penalty",
    "advantages": "[B, R] float: advantage estimates (0 on masked tokens)",
    "returns": "[B, R] float: return targets (critic)",
    # non-tensors
    "uid": "str: prompt-group id; the n responses to one prompt share it",
    "data_source": "str: dataset name, selects the reward function",
    "ground_truth": "str: reference answer (reward_model.ground_truth)",
    "extra_info": "dict: per-row extras from the dataset",
    "raw_prompt": "list[dict]: the chat messages of the prompt",
}
__doc__ += "\n".join(f"    ``{name}``: {meaning}" for name, meaning in FIELDS.items()) + "\n"


def _object_array(values: Any) -> np.ndarray:
    """A 1-D object array, also for lists of lists/dicts (np.array would build a 2-D array)."""
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        return values
    values = list(values)
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def _row_index(index: Any) -> slice | torch.Tensor:
    """int / slice / sequence / bool mask -> a slice or a LongTensor of row numbers."""
    if isinstance(index, int):
        return slice(index, index + 1 or None)
    if isinstance(index, (list, tuple, np.ndarray)):
        index = torch.as_tensor(np.asarray(index))
    if isinstance(index, torch.Tensor):
        return index.nonzero().squeeze(-1) if index.dtype == torch.bool else index.long()
    if isinstance(index, slice):
        return index
    raise TypeError(f"cannot index a Batch with {type(index).__name__}")


@dataclass
class Batch:
    tensors: TensorDict
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Iterable] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Batch:
        tensors, non_tensors = dict(tensors or {}), {k: _object_array(v) for k, v in (non_tensors or {}).items()}
        lengths = {k: v.shape[0] for k, v in tensors.items()} | {k: len(v) for k, v in non_tensors.items()}
        if not lengths:
            raise ValueError("a Batch needs at least one tensor or non-tensor field")
        first_key, size = next(iter(lengths.items()))
        for key, length in lengths.items():
            if length != size:
                raise ValueError(f"field {key!r} has {length} rows, expected {size} (as {first_key!r})")
        return cls(TensorDict(tensors, batch_size=[size]), non_tensors, dict(meta or {}))

    # ------------------------------------------------------------------ size and access
    def __len__(self) -> int:
        if self.tensors.batch_size:
            return int(self.tensors.batch_size[0])
        return len(next(iter(self.non_tensors.values()))) if self.non_tensors else 0

    @property
    def batch_size(self) -> int:
        return len(self)

    def keys(self) -> tuple[list[str], list[str]]:
        return list(self.tensors.keys()), list(self.non_tensors)

    def __getitem__(self, index: Any) -> Batch:
        """Rows by int, slice, index list/array/LongTensor or bool mask; always returns a Batch."""
        idx = _row_index(index)
        np_idx = idx.numpy() if isinstance(idx, torch.Tensor) else idx
        return Batch(
            self.tensors[idx], {k: _object_array(v[np_idx]) for k, v in self.non_tensors.items()}, dict(self.meta)
        )

    def _check_keys(self, tensor_keys, non_tensor_keys) -> tuple[list[str], list[str]]:
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
        """A Batch with only the named fields (None = all of that kind)."""
        t_keys, n_keys = self._check_keys(tensor_keys, non_tensor_keys)
        return Batch(self.tensors.select(*t_keys), {k: self.non_tensors[k] for k in n_keys}, dict(self.meta))

    def pop(self, tensor_keys: Sequence[str] = (), non_tensor_keys: Sequence[str] = ()) -> Batch:
        """Remove the named fields from this batch (mutates) and return them as a new Batch."""
        out = self.select(list(tensor_keys), list(non_tensor_keys))
        for key in tensor_keys:
            del self.tensors[key]
        for key in non_tensor_keys:
            del self.non_tensors[key]
        return out

    def union(self, other: Batch) -> Batch:
        """This batch's fields plus ``other``'s; a field in both must hold equal values. Meta is merged
        (this batch's values win)."""
        if len(self) != len(other):
            raise ValueError(f"cannot union batches of {len(self)} and {len(other)} rows")
        tensors = self.tensors.clone(recurse=False)
        for key, value in other.tensors.items():
            if key in tensors.keys() and not torch.equal(tensors[key], value):
                raise ValueError(f"union: tensor field {key!r} differs between the two batches")
            tensors[key] = value
        non_tensors = dict(self.non_tensors)
        for key, value in other.non_tensors.items():
            if key in non_tensors and not all(a == b for a, b in zip(non_tensors[key], value)):
                raise ValueError(f"union: non-tensor field {key!r} differs between the two batches")
            non_tensors[key] = value
        return Batch(tensors, non_tensors, {**other.meta, **self.meta})

    # ------------------------------------------------------------------ split and join
    def split(self, size: int) -> list[Batch]:
        """Consecutive pieces of ``size`` rows (the last may be shorter)."""
        if size < 1:
            raise ValueError(f"split size must be >= 1, got {size}")
        return [self[start : start + size] for start in range(0, len(self), size)]

    def chunk(self, n: int) -> list[Batch]:
        """``n`` equal pieces; the length must divide (pad first with :meth:`pad_to_divisor`)."""
        if len(self) % n:
            raise ValueError(f"cannot chunk {len(self)} rows into {n} equal pieces; use pad_to_divisor({n}) first")
        return self.split(len(self) // n)

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Rows of all batches in order; all must have the same fields. Meta comes from the first."""
        if not batches:
            raise ValueError("concat needs at least one batch")
        first = batches[0]
        keys = (set(first.tensors.keys()), set(first.non_tensors))
        for i, b in enumerate(batches[1:], 1):
            if (set(b.tensors.keys()), set(b.non_tensors)) != keys:
                raise ValueError(
                    f"concat: batch {i} has fields {sorted(b.tensors.keys()) + sorted(b.non_tensors)}, "
                    f"batch 0 has {sorted(keys[0]) + sorted(keys[1])}"
                )
        tensors = torch.cat([b.tensors for b in batches], dim=0)
        non_tensors = {k: _object_array(np.concatenate([b.non_tensors[k] for b in batches])) for k in keys[1]}
        return Batch(tensors, non_tensors, dict(first.meta))

    def repeat(self, n: int, interleave: bool = True) -> Batch:
        """Each row ``n`` times: interleaved [a, a, b, b] (a prompt's samples adjacent) or tiled [a, b, a, b]."""
        rows = torch.arange(len(self))
        index = rows.repeat_interleave(n) if interleave else rows.repeat(n)
        return self[index]

    def pad_to_divisor(self, divisor: int) -> tuple[Batch, int]:
        """Append rows copied from the start until the length divides ``divisor``; return the pad size.
        Copies (not zeros) keep padded rows valid inputs, so no NaN can come out of them."""
        pad = (-len(self)) % divisor
        if pad == 0:
            return self, 0
        index = torch.arange(pad) % len(self)
        return Batch.concat([self, self[index]]), pad

    def unpad(self, pad: int) -> Batch:
        return self[: len(self) - pad] if pad else self

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.tensors.to(device), dict(self.non_tensors), dict(self.meta))

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in self.tensors.items())
        return f"Batch(rows={len(self)}, tensors={{{tensors}}}, non_tensors={sorted(self.non_tensors)}, meta={self.meta})"
