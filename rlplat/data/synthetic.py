"""Built-in tasks: generators that write parquet in the common RLHF schema.

    python -m rlplat.data.synthetic --task arithmetic --out data/train.parquet --num 1000 --seed 0
    python -m rlplat.data.synthetic --task countdown --out data/cd.parquet --option think_format=true

Rows: ``data_source``, ``prompt`` (chat messages), ``ability``, ``reward_model`` {``style``,
``ground_truth``}, ``extra_info`` (``index``, ``split``, task extras) — the schema verl/TRL datasets use,
so the same files feed the peers. ``data.train_files=builtin:<task>`` materialises a cached split.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import sys
import tempfile
from pathlib import Path

from rlplat.registry import Registry, RegistryError

TASKS: Registry = Registry("built-in task")
SPLIT_DEFAULTS = {"train": (20_000, 0), "test": (256, 1)}  # rows, seed


class DataError(ValueError):
    """Bad data: the message names the file, row and key, and what was expected."""


def _row(source: str, content: str, answer: str, index: int, split: str, **extra) -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"index": index, "split": split, **extra},
    }


def _arithmetic_problems(digits: int, ops: str) -> list[tuple[int, str, int]]:
    top = 10**digits
    problems = []
    for op in ops:
        for a, b in itertools.product(range(top), repeat=2):
            if op == "-" and a < b:  # keep results non-negative
                continue
            problems.append((a, op, b))
    return problems


@TASKS.register("arithmetic")
def arithmetic(num: int, seed: int, split: str = "train", digits: int = 2, ops: str = "+") -> list[dict]:
    """``a+b=`` with ``digits``-digit operands (``ops`` "+" or "+-"); the answer is the exact integer.

    All problems are enumerated and shuffled with a fixed seed; the test split takes the first 256, the
    train split samples (seeded) from the rest, so train and test never share a problem.
    """
    if set(ops) - {"+", "-"} or not ops:
        raise DataError(f"arithmetic: ops must be made of '+' and '-', got {ops!r}")
    problems = _arithmetic_problems(int(digits), ops)
    random.Random(1234).shuffle(problems)
    test_count = SPLIT_DEFAULTS["test"][0]
    pool = problems[:test_count] if split == "test" else problems[test_count:]
    rng = random.Random(seed)
    picks = rng.sample(pool, num) if num <= len(pool) else [rng.choice(pool) for _ in range(num)]
    return [
        _row("rlplat/arithmetic", f"{a}{op}{b}=", str(a + b if op == "+" else a - b), i, split)
        for i, (a, op, b) in enumerate(picks)
    ]


def _countdown_instance(rng: random.Random, count: int, high: int) -> tuple[list[int], str, int]:
    """Numbers, a solution and its value, built left to right so the expression needs no evaluator."""
    apply = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}
    while True:
        numbers = [rng.randint(1, high) for _ in range(count)]
        expr, value = str(numbers[0]), numbers[0]
        for n in numbers[1:]:
            op = rng.choice("+-*")
            expr = f"({expr}{op}{n})" if op != "*" else f"{expr}*{n}"
            value = apply[op](value, n)
        if 0 < value <= 100:
            shuffled = numbers[:]
            rng.shuffle(shuffled)
            return shuffled, expr, value


@TASKS.register("countdown")
def countdown(
    num: int, seed: int, split: str = "train", count: int = 3, high: int = 20, think_format: bool = False
) -> list[dict]:
    """Reach a target (1..100) with ``count`` numbers in 1..``high``, each used once, with + - * and
    parentheses. ``think_format`` asks for ``<think>…</think><answer>…</answer>``."""
    rng = random.Random(seed + (10_000 if split == "test" else 0))
    rows = []
    for i in range(num):
        numbers, expr, target = _countdown_instance(rng, int(count), int(high))
        listed = ", ".join(map(str, numbers))
        if think_format:
            content = (f"Using the numbers [{listed}], create an equation that equals {target}. Use + - * and "
                       f"each number once. Think in <think></think>, then give the equation in <answer></answer>.")
        else:
            content = f"{listed} -> {target}:"
        rows.append(_row("rlplat/countdown", content, str(target), i, split, target=target, numbers=numbers,
                         solution=expr))
    return rows


def write_parquet(rows: list[dict], path: str | Path) -> Path:
    """Write rows atomically (temp file in the same directory, then rename)."""
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        pd.DataFrame(rows).to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def cache_dir() -> Path:
    return Path(os.environ.get("RLPLAT_CACHE", Path.home() / ".cache" / "rlplat"))


def builtin_path(task: str, split: str, num: int | None = None, seed: int | None = None) -> Path:
    """The cached parquet of a built-in task's split, generated on first use."""
    default_num, default_seed = SPLIT_DEFAULTS[split]
    num, seed = num or default_num, default_seed if seed is None else seed
    path = cache_dir() / "data" / f"{task}-{split}-{num}-{seed}.parquet"
    if not path.exists():
        write_parquet(TASKS.get(task)(num, seed, split=split), path)
    return path


def resolve_files(paths: str | list[str], split: str) -> list[str]:
    """``builtin:<task>`` entries become cached parquet files; other paths must exist."""
    key = "data.train_files" if split == "train" else "data.val_files"
    out = []
    for entry in [paths] if isinstance(paths, str) else list(paths):
        if entry.startswith("builtin:"):
            try:
                out.append(str(builtin_path(entry.split(":", 1)[1], split)))
            except RegistryError as err:
                raise DataError(f"{key}: {err}") from None
        elif not Path(entry).is_file():
            raise DataError(f"{key}: no such parquet file {entry!r}")
        else:
            out.append(entry)
    return out


def _option(text: str) -> tuple[str, object]:
    key, _, value = text.partition("=")
    lowered = value.lower()
    if lowered in ("true", "false"):
        return key, lowered == "true"
    return key, int(value) if value.lstrip("-").isdigit() else value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, help=f"one of: {', '.join(TASKS.names())}")
    parser.add_argument("--out", required=True, help="parquet file to write")
    parser.add_argument("--num", type=int, default=1000, help="rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default="train", choices=["train", "test"])
    parser.add_argument("--option", action="append", default=[], help="task option key=value (repeatable)")
    args = parser.parse_args(argv)
    try:
        task = TASKS.get(args.task)
        rows = task(args.num, args.seed, split=args.split, **dict(_option(o) for o in args.option))
    except (RegistryError, DataError, TypeError) as err:
        print(f"rlplat.data.synthetic: {err}", file=sys.stderr)
        return 2
    path = write_parquet(rows, args.out)
    print(f"wrote {len(rows)} rows of {args.task} ({args.split}) to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
