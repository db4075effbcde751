"""Parquet prompts for training: reading and checking rows, tokenising, batching, resumable order.

Rows follow the common RLHF schema (``data_source``, ``prompt``, ``reward_model.ground_truth``,
optional ``extra_info``). ``prompt`` is a list of chat messages, or a plain string (one user message).
Bad rows fail with one error naming the file, the row and the key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rlplat.data.synthetic import DataError

REQUIRED = ("data_source", "prompt", "reward_model")
TRUNCATION = ("error", "left", "right", "filter")


def _plain(value: Any) -> Any:
    """pyarrow hands back numpy arrays for lists; turn nested values into plain Python."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _messages(prompt: Any, where: str) -> list[dict]:
    prompt = _plain(prompt)
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and prompt and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt
    ):
        return [{"role": m["role"], "content": m["content"]} for m in prompt]
    raise DataError(f"{where}: prompt must be a string or a non-empty list of {{'role', 'content'}} messages, "
                    f"got {str(prompt)[:80]!r}")


def load_rows(files: Sequence[str]) -> list[dict]:
    """Read and check every row of the parquet files; each row gets its ``file`` and ``row`` origin."""
    import pyarrow.parquet as pq

    rows = []
    for path in files:
        try:
            table = pq.read_table(path)
        except Exception as err:  # pyarrow raises several types for unreadable files
            raise DataError(f"{path}: cannot read as parquet ({err})") from None
        missing = [c for c in REQUIRED if c not in table.column_names]
        if missing:
            raise DataError(f"{path}: missing column(s) {missing}; expected {list(REQUIRED)} (+ optional extra_info)")
        for index, record in enumerate(table.to_pylist()):
            where = f"{path} row {index}"
            reward = record["reward_model"]
            if not isinstance(reward, dict) or reward.get("ground_truth") is None:
                raise DataError(f"{where}: reward_model has no 'ground_truth' (expected {{'style': ..., 'ground_truth': ...}})")
            if not isinstance(record["data_source"], str):
                raise DataError(f"{where}: data_source must be a string, got {record['data_source']!r}")
            rows.append({
                "raw_prompt": _messages(record["prompt"], where),
                "data_source": record["data_source"],
                "ground_truth": str(reward["ground_truth"]),
                "extra_info": _plain(record.get("extra_info") or {}),
                "origin": where,
            })
    return rows


class RLDataset:
    """Tokenised prompts of one or more parquet files (tokenised once, at construction)."""

    def __init__(self, files: Sequence[str], tokenizer, max_prompt_length: int, truncation: str = "error",
                 apply_chat_template: bool = True):
        if truncation not in TRUNCATION:
            raise ValueError(f"truncation must be one of {TRUNCATION}, got {truncation!r}")
        self.items: list[dict] = []
        self.num_filtered = 0
        for row in load_rows(files):
            ids = self._tokenise(tokenizer, row["raw_prompt"], apply_chat_template)
            if len(ids) > max_prompt_length:
                if truncation == "error":
                    raise DataError(
                        f"{row['origin']}: prompt has {len(ids)} tokens > data.max_prompt_length={max_prompt_length}; "
                        f"raise it or set data.truncation=left|right|filter"
                    )
                if truncation == "filter":
                    self.num_filtered += 1
                    continue
                ids = ids[-max_prompt_length:] if truncation == "left" else ids[:max_prompt_length]
            self.items.append({**row, "prompt_ids": ids})
        if self.num_filtered:
            print(f"[data] dropped {self.num_filtered} prompts longer than {max_prompt_length} tokens", flush=True)
        if not self.items:
            raise DataError(f"{list(files)}: no usable prompt (all rows filtered or files empty)")

    @staticmethod
    def _tokenise(tokenizer, messages: list[dict], apply_chat_template: bool) -> list[int]:
        if apply_chat_template:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = "".join(m["content"] for m in messages)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        return self.items[index]


def collate(items: Sequence[dict], pad_token_id: int) -> tuple[dict[str, torch.Tensor], dict[str, list]]:
    """Left-pad the prompts: tensors ``prompts`` / ``prompt_mask`` ``[B, P]``, plus the per-row lists."""
    width = max(len(item["prompt_ids"]) for item in items)
    prompts = torch.full((len(items), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    for row, item in enumerate(items):
        ids = item["prompt_ids"]
        prompts[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        mask[row, width - len(ids):] = 1
    lists = {key: [item[key] for item in items] for key in ("raw_prompt", "data_source", "ground_truth", "extra_info")}
    return {"prompts": prompts, "prompt_mask": mask}, lists


class PromptSampler:
    """Batches of dataset indices, reshuffled each epoch with a seeded generator; resumable exactly.

    The last incomplete batch of an epoch is dropped so every step has the configured size.
    """

    def __init__(self, size: int, batch_size: int, shuffle: bool = True, seed: int = 0):
        if size < batch_size:
            raise DataError(f"the dataset has {size} prompts, fewer than data.train_batch_size_prompts={batch_size}")
        self.size, self.batch_size, self.shuffle, self.seed = size, batch_size, shuffle, seed
        self.epoch, self.position = 0, 0

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.size, generator=gen).tolist()

    def next_batch(self) -> list[int]:
        if self.position + self.batch_size > self.size:
            self.epoch, self.position = self.epoch + 1, 0
        batch = self._order()[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position, self.seed = state["epoch"], state["position"], state["seed"]
