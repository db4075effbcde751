"""Parquet prompts for training: reading and checking rows, tokenising, batching, a resumable order.

Rows follow the common RLHF schema: ``data_source`` (str), ``prompt`` (a list of ``{"role", "content"}``
messages, or a plain string meaning one user message), ``reward_model`` (a dict with ``ground_truth``) and
an optional ``extra_info`` dict. A bad row fails with one :class:`DataError` naming the file, the row
(0-based) and the key; nothing is trained on a half-checked file.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from rlplat.data.synthetic import DataError
from rlplat.data.vision import (
    MULTI_MODAL, ImageInputs, image_bytes, image_parts, row_images, shows_images, text_of,
)

if TYPE_CHECKING:
    import pandas as pd  # imported where a DataFrame is built: memory that training never needs

REQUIRED = ("data_source", "prompt")  # reward_model (with its ground_truth) too, unless the rewards need no answer
TRUNCATION = ("error", "left", "right", "filter")
ITEM_LISTS = ("raw_prompt", "data_source", "ground_truth", "extra_info")  # per-row values collate keeps as lists
SCHEMA_HINT = "expected {'style': ..., 'ground_truth': ...}"
IMAGE_HINT = "one <image> placeholder or {'type': 'image'} content part per image of the 'images' column"


def _plain(value: Any) -> Any:
    """Nested numpy arrays (how pandas hands back parquet lists) -> plain Python lists and dicts."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _as_dict(value: Any) -> Any:
    """Parquet map columns read back as lists of (key, value) pairs; structs already read as dicts."""
    if isinstance(value, list) and all(isinstance(kv, (list, tuple)) and len(kv) == 2 for kv in value):
        return {k: v for k, v in value}
    return value


def _messages(prompt: Any, where: str) -> list[dict]:
    """The prompt as messages: a string is one user message; a content is a string or a list of parts (an
    image's: rlplat.data.vision)."""
    prompt = _plain(prompt)
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and prompt and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), (str, list))
        for m in prompt
    ):
        return [{"role": m["role"], "content": m["content"]} for m in prompt]
    raise DataError(f"{where}: prompt must be a string or a non-empty list of {{'role': str, 'content': str}} "
                    f"messages, got {str(prompt)[:80]!r}")


def _ground_truth(reward: Any, where: str) -> str | None:
    """The row's answer, or None for a prompt-only row (no ``reward_model``, no ``ground_truth`` in it, or a
    missing value: None, or NaN as pandas writes a missing number), which only reward functions that need no
    answer can score (checked at start-up: :meth:`RLDataset.without_ground_truth`)."""
    reward = _as_dict(_plain(reward))
    if reward is None:
        return None
    if not isinstance(reward, dict):
        raise DataError(f"{where}: reward_model must be a dict, got {str(reward)[:80]!r} ({SCHEMA_HINT})")
    truth = reward.get("ground_truth")
    if truth is None or isinstance(truth, float) and not math.isfinite(truth):
        return None
    if isinstance(truth, float) and truth.is_integer():  # 122.0 (pandas, once a value is missing) means 122
        return str(int(truth))
    if isinstance(truth, (int, float)):  # e.g. a numeric answer column written by pandas
        return str(truth)
    if not isinstance(truth, str):
        raise DataError(f"{where}: reward_model.ground_truth must be a string, got {str(truth)[:80]!r}")
    if not truth.strip():
        raise DataError(f"{where}: reward_model.ground_truth is empty; expected an answer")
    return truth


def _check_row(record: dict, path: str, index: int) -> dict:
    where = f"{path} row {index}"
    if not isinstance(record["data_source"], str):
        raise DataError(f"{where}: data_source must be a string, got {record['data_source']!r}")
    extra = _as_dict(_plain(record.get("extra_info")))
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise DataError(f"{where}: extra_info must be a dict, got {str(extra)[:80]!r}")
    messages = _messages(record["prompt"], where)
    images = row_images(record, where, shows_images(messages))
    if images is not None or any(isinstance(m["content"], list) for m in messages):  # a row that may show images
        messages, shown = image_parts(messages, where)
        if shown != len(images or []):
            raise DataError(f"{where}: the prompt shows {shown} image(s) ({IMAGE_HINT}) but the row has "
                            f"{len(images or [])}")
    checked = {"prompt": messages, "extra_info": extra,
               "ground_truth": _ground_truth(record.get("reward_model"), where)}
    if images is not None:  # a file's rows without images get [] (and keep no image column)
        checked["images"] = [image_bytes(image, where) for image in images]
    return {**record, **checked, "source_file": path, "source_row": index}


def _read_file(path: str) -> tuple[list[dict], list[str]]:
    """The checked rows of one parquet file, and its columns plus the ones the checks add."""
    import pyarrow.parquet as pq

    if not os.path.isfile(path):
        raise DataError(f"{path}: no such parquet file")
    try:
        with pq.ParquetFile(path) as file:  # pq.read_table would import pyarrow.dataset, and pandas with it
            table = file.read()
    except Exception as err:  # pyarrow raises several types for unreadable files
        raise DataError(f"{path}: cannot read as parquet ({err})") from None
    missing = [c for c in REQUIRED if c not in table.column_names]
    if missing:
        raise DataError(f"{path}: missing column(s) {missing}; expected {list(REQUIRED)} (+ reward_model, "
                        f"extra_info)")
    rows = [_check_row(record, path, i) for i, record in enumerate(table.to_pylist())]
    added = ["extra_info", "ground_truth", "source_file", "source_row"] + ["images"] * any("images" in r for r in rows)
    return rows, list(dict.fromkeys([*table.column_names, *added]))


def load_rows(files: str | os.PathLike | Iterable[str | os.PathLike]) -> pd.DataFrame:
    """Read and check every row of one or more parquet files, concatenated in order.

    Columns: the file's own, with ``prompt`` normalised to a list of messages and ``extra_info`` to a
    dict (``{}`` when absent), plus ``ground_truth`` (str, None for a prompt-only row), ``source_file`` and
    ``source_row`` (0-based).
    """
    import pandas as pd

    return pd.concat([pd.DataFrame(rows, columns=columns) for rows, columns in _read_files(files)], ignore_index=True)


def _read_files(files: str | os.PathLike | Iterable[str | os.PathLike]) -> list[tuple[list[dict], list[str]]]:
    paths = _paths(files)
    if not paths:
        raise DataError("no parquet files given")
    return [_read_file(path) for path in paths]


def _paths(files: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    return [str(files)] if isinstance(files, (str, os.PathLike)) else [str(f) for f in files]


#: a row's extra_info -> the tool schemas its prompt is rendered with (the chat template's ``tools=``), or None
ToolsOf = Callable[[Mapping | None], "list[dict] | None"]


class _Encoded(NamedTuple):
    items: list[dict]  # the dataset's items (prompts dropped by truncation="filter" left out)
    num_filtered: int
    num_rows: int


# The items of the last RECENT_DATASETS datasets this process tokenised, by what they were made from: a
# second run in the same process (a sweep, a notebook, a test session) over the same files and tokenizer
# reuses them instead of reading and tokenising again (~3 s for the built-in task's 20,000 prompts). The
# datasets then share the item dicts, which rlplat never writes to.
RECENT_DATASETS = 4
_RECENT: OrderedDict[tuple, _Encoded] = OrderedDict()


def _encoding_key(paths: list[str], tokenizer, max_prompt_length: int, truncation: str,
                  apply_chat_template: bool) -> tuple | None:
    """What a dataset's items depend on: each file's path, size and modification time, the tokenizer's
    vocabulary, rules, special tokens and chat template, and the settings. None (nothing reused) for a
    tokenizer without a serialisable fast backend or a file that cannot be read (reading reports it)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        files = tuple((os.path.realpath(p), st.st_size, st.st_mtime_ns) for p in paths for st in [os.stat(p)])
    except OSError:
        return None
    described = [backend.to_str(), str(getattr(tokenizer, "chat_template", None)),
                 str(tokenizer.special_tokens_map), type(tokenizer).__name__]
    fingerprint = hashlib.sha256("\0".join(described).encode()).hexdigest()
    return files, fingerprint, max_prompt_length, truncation, apply_chat_template


class RLDataset:
    """The tokenised prompts of one or more parquet files (tokenised once, at construction).

    ``dataset[i]`` is a dict with ``prompt_ids`` (list[int]), ``raw_prompt`` (the messages),
    ``data_source``, ``ground_truth`` (str; None for a prompt-only row), ``extra_info`` (dict) and ``file``
    (its parquet file, one of ``files``). Prompts longer than
    ``max_prompt_length`` tokens fail (``truncation="error"``), keep their last / first tokens
    (``"left"`` / ``"right"``) or are dropped and counted in ``num_filtered`` (``"filter"``). ``tools_of``
    gives the tools a row's prompt shows the model (an agent loop's: the template renders them). A row with
    images (:mod:`rlplat.data.vision`) needs ``images``, the model's :class:`ImageInputs`: its item also holds
    ``images`` (the encoded images) and its ``prompt_ids`` each image's tokens.
    """

    def __init__(self, files: str | os.PathLike | Sequence[str | os.PathLike], tokenizer, max_prompt_length: int,
                 truncation: str = "error", apply_chat_template: bool = True, tools_of: ToolsOf | None = None,
                 images: ImageInputs | None = None):
        if truncation not in TRUNCATION:
            raise ValueError(f"data.truncation={truncation!r} is not one of {', '.join(TRUNCATION)}")
        if max_prompt_length < 1:
            raise ValueError(f"data.max_prompt_length must be positive, got {max_prompt_length}")
        self.tokenizer, self.max_prompt_length = tokenizer, max_prompt_length
        self.truncation, self.apply_chat_template, self.tools_of = truncation, apply_chat_template, tools_of
        self.images = images
        key = None if tools_of or images else _encoding_key(_paths(files), tokenizer, max_prompt_length, truncation,
                                                  apply_chat_template)
        encoded = _RECENT.get(key) if key else None
        if encoded is not None:
            _RECENT.move_to_end(key)  # the least recently used is dropped first
        else:
            rows = [row for file_rows, _ in _read_files(files) for row in file_rows]
            items = self._encode(rows)
            kept = [item for item in items if item is not None]
            encoded = _Encoded(kept, len(items) - len(kept), len(rows))
            if key:
                _RECENT[key] = encoded
                while len(_RECENT) > RECENT_DATASETS:
                    _RECENT.popitem(last=False)
        self.files = _paths(files)
        self.items: list[dict] = list(encoded.items)
        self.num_filtered = encoded.num_filtered
        if self.num_filtered:
            print(f"[rlplat.data] dropped {self.num_filtered} of {encoded.num_rows} prompts longer than "
                  f"data.max_prompt_length={max_prompt_length} tokens (data.truncation=filter)", flush=True)
        if not self.items:
            raise DataError(f"{', '.join(_paths(files))}: no usable prompt (the files "
                            f"have no rows, or every prompt was longer than data.max_prompt_length)")

    def _encode(self, rows: list[dict]) -> list[dict | None]:
        """Items of checked rows (None for a prompt dropped by ``truncation="filter"``)."""
        _check_model_reads_images(rows, self.images, self.apply_chat_template)
        rendered: dict[str, str] = {}  # rows with the same messages and tools (a visual task's) render once

        def render(row: dict) -> str:
            tools = self._tools(row)
            key = repr((row["prompt"], tools))
            if key not in rendered:
                rendered[key] = self._render(self.tokenizer, row["prompt"], self.apply_chat_template, tools)
            return rendered[key]

        texts = [with_image_tokens(row, render(row), self.images) for row in rows]
        # One batched call: the fast tokenizer splits 20,000 prompts in parallel instead of one by one.
        all_ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        items: list[dict | None] = []
        limit = self.max_prompt_length
        for row, ids in zip(rows, all_ids):
            where = f"{row['source_file']} row {row['source_row']}"
            if not ids:
                raise DataError(f"{where}: the prompt is empty after tokenisation")
            if len(ids) > limit:
                if self.truncation == "error":
                    raise DataError(f"{where}: prompt has {len(ids)} tokens > data.max_prompt_length={limit}; set "
                                    f"data.truncation=left|right|filter or a larger data.max_prompt_length")
                if self.truncation == "filter":
                    items.append(None)
                    continue
                if row.get("images"):
                    raise DataError(f"{where}: a prompt with images has {len(ids)} tokens > data.max_prompt_length="
                                    f"{limit}, and its image tokens cannot be cut: set data.truncation=filter, a "
                                    f"larger data.max_prompt_length or a smaller data.image_max_pixels")
                ids = ids[-limit:] if self.truncation == "left" else ids[:limit]
            item = {"prompt_ids": list(ids), "raw_prompt": row["prompt"], "data_source": row["data_source"],
                    "ground_truth": row["ground_truth"], "extra_info": row["extra_info"]}
            if row["ground_truth"] is None:  # a prompt-only row: named if a reward needs an answer
                item["where"] = where
            item["file"] = row["source_file"]  # a mixture's sampler counts each file's rows
            if row.get("images"):
                item["images"], item["source"] = row["images"], where
            items.append(item)
        return items

    def rows_per_file(self) -> list[int]:
        """The usable prompts of each file, in the files' order (the items hold them one file after another)."""
        counts = Counter(item["file"] for item in self.items)
        return [counts.get(path, 0) for path in self.files]

    def without_ground_truth(self) -> list[str]:
        """Where the prompt-only rows are (``file row N``): rows without ``reward_model.ground_truth``."""
        return [item["where"] for item in self.items if item is not None and item["ground_truth"] is None]

    def _tools(self, row: dict) -> list[dict] | None:
        if self.tools_of is None:
            return None
        try:
            return self.tools_of(row["extra_info"])
        except (KeyError, ValueError) as err:  # an unknown tool name, a tool file that does not load
            raise DataError(f"{row['source_file']} row {row['source_row']}: extra_info.tools: {err}") from None

    def encode_rows(self, records: Sequence[Mapping], source: str) -> list[dict]:
        """Items for rows given at run time (``data.dynamic_prompts_fn``), checked and tokenised as the
        files' rows are; errors name ``source`` and the row. A prompt ``truncation="filter"`` drops is
        left out."""
        checked = []
        for index, record in enumerate(records):
            if not isinstance(record, Mapping) or any(key not in record for key in REQUIRED):
                raise DataError(f"{source} row {index}: expected a dict with keys {list(REQUIRED)} (+ optional "
                                f"extra_info), got {str(record)[:80]!r}")
            checked.append(_check_row(dict(record), source, index))
        return [item for item in self._encode(checked) if item is not None]

    @staticmethod
    def _render(tokenizer, messages: list[dict], apply_chat_template: bool, tools: list[dict] | None = None) -> str:
        if not apply_chat_template:
            return "".join(text_of(m["content"]) for m in messages)
        try:
            return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        except ValueError as err:  # e.g. a base model's tokenizer has no chat template
            raise DataError(f"cannot apply the tokenizer's chat template ({err}); "
                            f"set data.apply_chat_template=false for a base model") from None

    def probe_ids(self) -> list[int]:
        """A prompt for the weight sync's log-prob probe: the first without images (an image's tokens mean nothing
        without its pixels, and are out of a vision-language model's policy), else the first one's text."""
        for item in self.items:
            if "images" not in item:
                return list(item["prompt_ids"])
        return [t for t in self.items[0]["prompt_ids"] if t not in self.images.vision_ids]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        return self.items[index]


def _check_model_reads_images(rows: list[dict], images: ImageInputs | None, apply_chat_template: bool) -> None:
    """A row with images needs a vision-language model's image inputs, and the chat template (which marks each
    image's place with the model's vision tokens)."""
    shown = next((row for row in rows if row.get("images")), None)
    if shown is None:
        return
    where = f"{shown['source_file']} row {shown['source_row']}"
    if images is None:
        raise DataError(f"{where}: the row has images, but the model has no image processor: a vision-language "
                        f"model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) is needed in model.path")
    if not apply_chat_template:
        raise DataError(f"{where}: a prompt with images needs data.apply_chat_template=true (the chat template "
                        f"marks each image's place with the model's vision tokens)")


def with_image_tokens(row: dict, text: str, images: ImageInputs | None) -> str:
    """The rendered prompt of a row: with images, each image token repeated as often as its image takes."""
    if not row.get("images"):
        return text
    where = f"{row['source_file']} row {row['source_row']}"
    return images.expand(text, [images.token_count(data, where) for data in row["images"]], where)


def prompt_token_lengths(files: str | os.PathLike | Iterable[str | os.PathLike], tokenizer,
                         apply_chat_template: bool = True, tools_of: ToolsOf | None = None,
                         images: ImageInputs | None = None) -> list[tuple[str, int]]:
    """("file row N", tokens) of every prompt of ``files`` as :class:`RLDataset` renders and tokenises it, its
    images' tokens counted (whatever its length: what ``data.truncation`` would do is the caller's question)."""
    rows = [row for file_rows, _ in _read_files(files) for row in file_rows]
    _check_model_reads_images(rows, images, apply_chat_template)
    texts = [with_image_tokens(row, RLDataset._render(tokenizer, row["prompt"], apply_chat_template,
                                                      tools_of(row["extra_info"]) if tools_of else None), images)
             for row in rows]
    all_ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    return [(f"{row['source_file']} row {row['source_row']}", len(ids)) for row, ids in zip(rows, all_ids)]


def collate(items: Sequence[Mapping], pad_token_id: int,
            images: ImageInputs | None = None) -> tuple[dict[str, torch.Tensor], dict[str, list]]:
    """Left-pad ``prompt_ids`` to the batch's longest prompt (generation continues from the right edge).

    Returns tensors ``prompts`` [batch, prompt_len] int64 and ``prompt_mask`` [batch, prompt_len] int64
    (1 on real tokens), and the lists ``raw_prompt``, ``data_source``, ``ground_truth``, ``extra_info``; with
    ``images`` (a vision-language model's), also ``multi_modal_inputs``: each row's image inputs (None for a row
    without images; batches with and without images then join).
    """
    if not items:
        raise ValueError("collate needs at least one item")
    width = max(len(item["prompt_ids"]) for item in items)
    prompts = torch.full((len(items), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    for row, item in enumerate(items):
        ids = item["prompt_ids"]
        prompts[row, width - len(ids):] = torch.as_tensor(ids, dtype=torch.long)
        mask[row, width - len(ids):] = 1
    lists = {key: [item[key] for item in items] for key in ITEM_LISTS}
    if images is not None:
        lists[MULTI_MODAL] = [images.inputs(item["images"], item["source"]) if "images" in item else None
                              for item in items]
    elif any("images" in item for item in items):
        raise ValueError("prompts with images need the model's image inputs (collate's images=)")
    return {"prompts": prompts, "prompt_mask": mask}, lists


class PromptSampler:
    """Endless batches of ``batch_size`` dataset indices, epoch after epoch; resumable exactly.

    With ``shuffle`` each epoch is a fresh permutation from ``torch.Generator().manual_seed(seed + epoch)``,
    otherwise indices come in order. An epoch's last incomplete batch is dropped so every step has the
    configured number of prompts. ``state_dict()`` ({epoch, position, seed}) restored into a sampler of the
    same dataset size and batch size continues with exactly the batches the original would have given.
    """

    def __init__(self, size: int, batch_size: int, shuffle: bool = True, seed: int = 0):
        if batch_size < 1:
            raise ValueError(f"data.train_batch_size_prompts must be positive, got {batch_size}")
        if size < batch_size:
            raise DataError(f"the dataset has {size} prompts, fewer than data.train_batch_size_prompts={batch_size}; "
                            f"use more data or a smaller batch")
        self.size, self.batch_size, self.shuffle, self.seed = size, batch_size, shuffle, seed
        self.epoch, self.position = 0, 0
        self._order: tuple[int, list[int]] | None = None  # (epoch, permutation) cache

    def order(self, epoch: int) -> list[int]:
        """The index order of one epoch."""
        if self._order is None or self._order[0] != epoch:
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + epoch)
                self._order = (epoch, torch.randperm(self.size, generator=generator).tolist())
            else:
                self._order = (epoch, list(range(self.size)))
        return self._order[1]

    def next_batch(self, count: int | None = None) -> list[int]:
        """The next ``count`` indices (default ``batch_size``); an epoch's rest shorter than that is skipped."""
        count = self.batch_size if count is None else count
        if self.position + count > self.size:
            self.epoch, self.position = self.epoch + 1, 0
        batch = self.order(self.epoch)[self.position : self.position + count]
        self.position += count
        return batch

    def __iter__(self) -> Iterator[list[int]]:
        return self

    def __next__(self) -> list[int]:
        return self.next_batch()

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        missing = [key for key in ("epoch", "position", "seed") if key not in state]
        if missing:
            raise ValueError(f"sampler state has no {missing}; expected keys epoch, position, seed")
        if not 0 <= state["position"] <= self.size:
            raise ValueError(f"sampler state position={state['position']} is outside a dataset of {self.size} prompts")
        self.epoch, self.position, self.seed = int(state["epoch"]), int(state["position"]), int(state["seed"])
        self._order = None
