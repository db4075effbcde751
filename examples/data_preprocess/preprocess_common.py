"""Shared reading and writing for the dataset preprocessors in this folder.

Every preprocessor reads its dataset in the ORIGINAL format, either from the Hugging Face hub by name
(``--dataset openai/gsm8k``; needs the ``datasets`` package) or from local ``.jsonl`` / ``.json`` /
``.parquet`` files (``--train-file``, ``--test-file``), and writes ``train.parquet`` / ``test.parquet`` in
the common RLHF schema rlplat trains on::

    data_source: str                        picks the reward function (rlplat.reward.scorer_for)
    prompt:      [{"role": "user", "content": str}]
    ability:     str
    reward_model: {"style": "rule", "ground_truth": str}
    extra_info:  {"split": str, "index": int, ...}

Bad input (a missing file, a row without a needed column) stops with one line naming the file, row and
column, exit status 2, and nothing written.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from rlplat.data import write_parquet  # atomic: readers never see a half-written file


class PreprocessError(ValueError):
    """Bad input: the message names the file (or dataset), the row and the column."""


def parser(description: str, default_dataset: str | None, default_out: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--dataset", default=default_dataset,
                   help=f"Hugging Face dataset name (default: {default_dataset}); ignored when --train-file is given")
    p.add_argument("--config", default=None, help="dataset configuration name on the hub (e.g. 'main')")
    p.add_argument("--train-file", default=None, help="local .jsonl/.json/.parquet in the original format")
    p.add_argument("--test-file", default=None, help="local .jsonl/.json/.parquet in the original format")
    p.add_argument("--out-dir", default=default_out, help=f"where train.parquet/test.parquet go (default: {default_out})")
    p.add_argument("--max-rows", type=int, default=None, help="keep only the first N rows of each split")
    return p


def read_local(path: str) -> list[dict]:
    """Rows of a local .jsonl / .json (a list of objects) / .parquet file."""
    file = Path(path)
    if not file.is_file():
        raise PreprocessError(f"{path}: no such file")
    if file.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(file).to_dict(orient="records")
    if file.suffix not in (".jsonl", ".json"):
        raise PreprocessError(f"{path}: expected a .jsonl, .json or .parquet file")
    text = file.read_text(encoding="utf-8")
    if file.suffix == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise PreprocessError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
        if not isinstance(rows, list):
            raise PreprocessError(f"{path}: expected a JSON list of objects")
        return rows
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise PreprocessError(f"{path} line {number}: not valid JSON ({err.msg})") from None
    return rows


def read_hub(name: str, config: str | None, split: str) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise PreprocessError(
            f"reading {name!r} from the Hugging Face hub needs the 'datasets' package "
            "(pip install datasets), or pass local files with --train-file/--test-file"
        ) from None
    return [dict(row) for row in datasets.load_dataset(name, config, split=split)]


def column(row: dict, key: str, where: str):
    value = row.get(key) if isinstance(row, dict) else None
    if value is None:
        keys = ", ".join(row) if isinstance(row, dict) else type(row).__name__
        raise PreprocessError(f"{where}: missing column {key!r} (row has: {keys})")
    return value


def rlhf_row(source: str, content: str, ground_truth: str, split: str, index: int, ability: str = "math",
             **extra) -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": content}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": str(ground_truth)},
        "extra_info": {"split": split, "index": index, **extra},
    }


def convert(rows: Iterable[dict], origin: str, split: str, to_row: Callable[[dict, str, str, int], dict],
            max_rows: int | None = None) -> list[dict]:
    out = []
    for index, row in enumerate(rows):
        if max_rows is not None and index >= max_rows:
            break
        out.append(to_row(row, f"{origin} row {index}", split, index))
    if not out:
        raise PreprocessError(f"{origin}: no rows")
    return out


def run(args: argparse.Namespace, to_row: Callable[[dict, str, str, int], dict],
        hub_splits: tuple[str, str] = ("train", "test"), hub_reader: Callable[..., list[dict]] = read_hub) -> int:
    """Read both splits, convert every row (all checked before anything is written), write both files."""
    try:
        splits = {}
        if args.train_file:
            if not args.test_file:
                raise PreprocessError("--train-file needs --test-file too (the validation split)")
            sources = {"train": (args.train_file, read_local(args.train_file)),
                       "test": (args.test_file, read_local(args.test_file))}
        elif args.dataset:
            sources = {split: (f"{args.dataset}[{hub}]", hub_reader(args.dataset, args.config, hub))
                       for split, hub in zip(("train", "test"), hub_splits)}
        else:
            raise PreprocessError("give --dataset NAME or --train-file/--test-file")
        for split, (origin, rows) in sources.items():
            splits[split] = convert(rows, origin, split, to_row, args.max_rows)
    except PreprocessError as err:
        print(f"preprocess: {err}", file=sys.stderr)
        return 2
    out = Path(args.out_dir)
    for split, rows in splits.items():
        write_parquet(rows, out / f"{split}.parquet")
        print(f"wrote {len(rows)} rows to {out / f'{split}.parquet'}")
    return 0
