"""Built-in tasks: generators that write parquet in the common RLHF schema.

    python -m rlplat.data.synthetic --task arithmetic --out data/train.parquet --num 1000 --seed 0
    python -m rlplat.data.synthetic --task arithmetic --out data/hard.parquet --option digits=3 --option ops=+-
    python -m rlplat.data.synthetic --task countdown --out data/cd.parquet --option think_format=true
    python -m rlplat.data.synthetic --task tool_arithmetic --out data/tool.parquet --option digits=4

Each row has ``data_source``, ``prompt`` (chat messages), ``ability``, ``reward_model`` {``style``,
``ground_truth``} and ``extra_info`` (``index``, ``split``, task extras): the schema verl's and TRL's
prepared datasets use, so the same files feed the peers. ``data.train_files=builtin:<task>`` materialises a
cached split with :func:`builtin_path`.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import math
import os
import random
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from rlplat.registry import Registry, RegistryError
from rlplat.utils.files import plain_modes

TASKS: Registry[Callable[..., list[dict]]] = Registry("built-in task")
SPLIT_DEFAULTS = {"train": (20_000, 0), "test": (256, 1)}  # split -> (rows, seed) of builtin:<task>
# tasks whose train split is smaller: a picture per row costs its drawing and, at every read, its header
TRAIN_ROWS = {"shapes": 4096}
SPLIT_KEYS = {"train": "data.train_files", "test": "data.val_files"}  # where the user named the files


class DataError(ValueError):
    """Bad data or a bad data option: the message names the file, row and key, and what was expected."""


def _row(source: str, content: str, answer: str, index: int, split: str, **extra) -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"index": index, "split": split, **extra},
    }


def _rng(task: str, split: str, seed: int) -> random.Random:
    # String seeds hash with SHA-512 inside `random`, so streams are stable across runs and
    # PYTHONHASHSEED, and train/test of the same seed still draw different streams.
    return random.Random(f"{task}/{split}/{seed}")


# ---------------------------------------------------------------------------------------------- arithmetic
ARITHMETIC_HOLDOUT = 256  # problems reserved for the test split when the problem space is enumerated
_SPLIT_SHUFFLE_SEED = "arithmetic-split"  # fixed: every seed's train split must exclude the same test problems
_HASHED_TEST_BUCKETS = 100  # beyond 2 digits, 1 problem in 100 (chosen by hash) is test-only


def _arith(a: int, op: str, b: int) -> tuple[int, str, int]:
    return (b, op, a) if op == "-" and a < b else (a, op, b)  # order operands: results stay non-negative


def _is_hashed_test(a: int, op: str, b: int) -> bool:
    digest = hashlib.blake2b(f"{a}{op}{b}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % _HASHED_TEST_BUCKETS == 0


def _cycle(pool: list, num: int, rng: random.Random) -> list:
    """``num`` picks from ``pool``: a seeded shuffle, repeated with a fresh shuffle when ``num`` exceeds it."""
    picks: list = []
    while len(picks) < num:
        order = pool[:]
        rng.shuffle(order)
        picks.extend(order[: num - len(picks)])
    return picks


def _enumerated_problems(digits: int, ops: str, split: str, num: int, rng: random.Random) -> list[tuple]:
    top = 10**digits
    problems = [(a, op, b) for op in ops for a in range(top) for b in range(top) if op == "+" or a >= b]
    random.Random(_SPLIT_SHUFFLE_SEED).shuffle(problems)
    holdout = min(ARITHMETIC_HOLDOUT, len(problems) // 2)  # 1 digit has only 100 "+" problems
    return _cycle(problems[:holdout] if split == "test" else problems[holdout:], num, rng)


def _hashed_problems(digits: int, ops: str, split: str, num: int, rng: random.Random) -> list[tuple]:
    # Too many problems to enumerate: draw at random and let a stable hash decide which split owns each.
    top, picks, seen = 10**digits, [], set()
    distinct = sum(top * top if op == "+" else top * (top + 1) // 2 for op in ops)
    owned = distinct // _HASHED_TEST_BUCKETS if split == "test" else distinct
    unique = num <= owned // 2  # distinct rows unless that would make the draw crawl
    while len(picks) < num:
        problem = _arith(rng.randrange(top), rng.choice(ops), rng.randrange(top))
        if _is_hashed_test(*problem) == (split == "test") and not (unique and problem in seen):
            picks.append(problem)
            seen.add(problem)
    return picks


@TASKS.register("arithmetic")
def arithmetic(num: int, seed: int, split: str = "train", digits: int = 2, ops: str = "+") -> list[dict]:
    """``a+b=`` (or ``a-b=``) with operands in ``0 .. 10**digits - 1``; the answer is the exact integer.

    The prompt is that short on purpose: a tiny character-level model learns it within minutes. With up
    to 2 digits every problem is enumerated and shuffled with a fixed seed; the first 256 are the test
    split's, train draws (seeded, repeating only once all are used) from the rest. With more digits a
    stable hash sends 1 problem in 100 to test. Either way train and test never share a problem.
    """
    if not isinstance(digits, int) or isinstance(digits, bool) or digits < 1:
        raise DataError(f"arithmetic: option digits must be a positive integer, got {digits!r}")
    if not isinstance(ops, str) or not ops or set(ops) - {"+", "-"} or len(set(ops)) != len(ops):
        raise DataError(f"arithmetic: option ops must be '+', '-' or '+-', got {ops!r}")
    draw = _enumerated_problems if digits <= 2 else _hashed_problems
    problems = draw(digits, ops, split, num, _rng("arithmetic", split, seed))
    return [
        _row("rlplat/arithmetic", f"{a}{op}{b}=", str(a + b if op == "+" else a - b), i, split)
        for i, (a, op, b) in enumerate(problems)
    ]


# ----------------------------------------------------------------------------------------------- countdown
COUNTDOWN_MAX_TARGET = 100  # targets in 1..100 keep the answers short and the search small


def _countdown_instance(rng: random.Random, count: int, max_number: int) -> tuple[list[int], str, int]:
    """Numbers, one solution and the target: a random expression tree over a random permutation, redrawn
    until its value is in 1..100."""
    apply = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}
    while True:
        numbers = [rng.randint(1, max_number) for _ in range(count)]
        terms = [(str(n), n) for n in rng.sample(numbers, count)]
        while len(terms) > 1:  # join two neighbouring terms until one expression is left
            i = rng.randrange(len(terms) - 1)
            (left, x), (right, y) = terms[i], terms[i + 1]
            op = rng.choice("+-*")
            terms[i : i + 2] = [(f"({left}{op}{right})", apply[op](x, y))]
        expr, value = terms[0]
        if 0 < value <= COUNTDOWN_MAX_TARGET:
            return numbers, expr[1:-1], value  # the last join's parentheses enclose everything


@TASKS.register("countdown")
def countdown(num: int, seed: int, split: str = "train", count: int = 3, max_number: int = 20,
              think_format: bool = False) -> list[dict]:
    """Reach a target (1..100) with ``count`` numbers in 1..``max_number``, each used exactly once, with
    + - * and parentheses. ``think_format`` asks for ``<think>…</think><answer>…</answer>``, otherwise for
    the bare expression. ``extra_info`` carries ``numbers`` and ``target`` (the scorer checks both) and one
    ``solution``."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 2:
        raise DataError(f"countdown: option count must be an integer >= 2, got {count!r}")
    if not isinstance(max_number, int) or isinstance(max_number, bool) or max_number < 1:
        raise DataError(f"countdown: option max_number must be a positive integer, got {max_number!r}")
    rng, rows = _rng("countdown", split, seed), []
    for i in range(num):
        numbers, solution, target = _countdown_instance(rng, count, max_number)
        listed = ", ".join(map(str, numbers))
        if think_format:
            content = (f"Using the numbers [{listed}], create an equation that equals {target}. You can use + - * "
                       f"and parentheses, and each number exactly once. Think inside <think></think>, then give "
                       f"only the equation inside <answer></answer>, for example <answer>(1+2)*3</answer>.")
        else:
            content = (f"Using the numbers [{listed}], each exactly once, with + - * and parentheses, make "
                       f"{target}. Reply with the expression only.")
        rows.append(_row("rlplat/countdown", content, str(target), i, split, target=target, numbers=numbers,
                         solution=solution))
    return rows


# ---------------------------------------------------------------------------------------- tool arithmetic
@TASKS.register("tool_arithmetic")
def tool_arithmetic(num: int, seed: int, split: str = "train", digits: int = 3) -> list[dict]:
    """``a*b=`` with two ``digits``-digit operands whose product has ``2 * digits`` digits (operands from
    the least whose square has that many, 317 for 3 digits, to ``10**digits - 1``): products too large for
    the embedded model to compute in its head, for an agent with the ``calculator`` tool
    (``extra_info["tools"] = ["calculator"]``, the tools a row offers). Every answer has one length: the
    embedded tool model copies a tool result of the usual length, not one digit shorter (docs/agents.md).
    The answer is the exact product, scored by the ``arithmetic`` rules (``data_source``
    ``rlplat/tool_arithmetic``). A stable hash sends 1 problem in 100 to the test split, so train and test
    never share one."""
    if not isinstance(digits, int) or isinstance(digits, bool) or not 2 <= digits <= 9:
        raise DataError(f"tool_arithmetic: option digits must be an integer from 2 to 9, got {digits!r}")
    low, high = math.isqrt(10 ** (2 * digits - 1) - 1) + 1, 10**digits - 1
    rng, rows, seen = _rng("tool_arithmetic", split, seed), [], set()
    distinct = (high - low + 1) ** 2
    unique = num <= (distinct // _HASHED_TEST_BUCKETS if split == "test" else distinct) // 2  # as _hashed_problems
    while len(rows) < num:
        a, b = rng.randint(low, high), rng.randint(low, high)
        if _is_hashed_test(a, "*", b) != (split == "test") or (unique and (a, b) in seen):
            continue
        seen.add((a, b))
        rows.append(_row("rlplat/tool_arithmetic", f"{a}*{b}=", str(a * b), len(rows), split, tools=["calculator"]))
    return rows


# ------------------------------------------------------------------------------------------------- shapes
SHAPE_COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220), "black": (20, 20, 20)}
SHAPE_CELL = 28  # pixels: a Qwen-VL image token covers 2 x 2 patches of 14 pixels, one cell of the grid


def _png(image) -> bytes:
    import io

    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


@TASKS.register("shapes")
def shapes(num: int, seed: int, split: str = "train", max_count: int = 4, grid: int = 3) -> list[dict]:
    """A picture and "How many shapes?": 1 to ``max_count`` filled squares and circles (random colours and
    sizes) in distinct cells of a ``grid`` x ``grid`` board of 28-pixel cells on white, drawn with PIL; the
    answer is the count. The rows are in verl's multimodal form: the PNG in an ``images`` column
    (``{"bytes", "path"}``) and an ``<image>`` placeholder in the prompt (rlplat.data.vision), for a
    vision-language model (``model.path=embedded-vl``); scored by the ``arithmetic`` rules (the exact integer,
    ``data_source`` ``rlplat/shapes``). Train and test draw from different random streams."""
    from PIL import Image, ImageDraw

    if not isinstance(grid, int) or isinstance(grid, bool) or not 2 <= grid <= 8:
        raise DataError(f"shapes: option grid must be an integer from 2 to 8, got {grid!r}")
    if not isinstance(max_count, int) or isinstance(max_count, bool) or not 1 <= max_count <= min(9, grid * grid):
        raise DataError(f"shapes: option max_count must be an integer from 1 to {min(9, grid * grid)}, "
                        f"got {max_count!r}")
    rng, rows = _rng("shapes", split, seed), []
    for index in range(num):
        count = rng.randint(1, max_count)
        image = Image.new("RGB", (grid * SHAPE_CELL, grid * SHAPE_CELL), (255, 255, 255))
        draw = ImageDraw.Draw(image)
        for cell in rng.sample(range(grid * grid), count):
            side = rng.randint(12, 22)
            x = cell % grid * SHAPE_CELL + rng.randint(0, SHAPE_CELL - side)
            y = cell // grid * SHAPE_CELL + rng.randint(0, SHAPE_CELL - side)
            box, colour = (x, y, x + side - 1, y + side - 1), SHAPE_COLOURS[rng.choice(sorted(SHAPE_COLOURS))]
            (draw.rectangle if rng.random() < 0.5 else draw.ellipse)(box, fill=colour)
        row = _row("rlplat/shapes", "<image>How many shapes?", str(count), index, split)
        rows.append({**row, "ability": "vision", "images": [{"bytes": _png(image), "path": None}]})
    return rows


# The calculator call of a demonstration, in the hermes format with the arguments first: the expression is
# then copied from closer to the prompt (a tiny model learns that copy in fewer steps).
DEMONSTRATION_CALL = '<tool_call>{"arguments":{"expression":"EXPRESSION"},"name":"calculator"}</tool_call>'


def with_tool_demonstrations(rows: list[dict], share: float, seed: int) -> list[dict]:
    """``tool_arithmetic`` rows as supervised targets: a ``share`` of them (chosen with ``seed``) show the
    tool being used (``extra_info["solution_messages"]``: :data:`DEMONSTRATION_CALL`, the tool's answer,
    then the answer), the others answer at once (``extra_info["solution"]``). The warm start of the
    embedded tool model: GRPO then has tool use to reinforce."""
    rng = random.Random(seed)
    out = []
    for row in rows:
        expression, answer = row["prompt"][0]["content"].removesuffix("="), row["reward_model"]["ground_truth"]
        extra = dict(row["extra_info"])
        if rng.random() < share:
            call = DEMONSTRATION_CALL.replace("EXPRESSION", expression)
            extra["solution_messages"] = [{"role": "assistant", "content": call}, {"role": "tool", "content": answer},
                                          {"role": "assistant", "content": answer}]
        else:
            extra["solution"] = answer
        out.append({**row, "extra_info": extra})
    return out


# ------------------------------------------------------------------------------------- generating, caching
def task_options(task: str) -> dict[str, object]:
    """The options of a registered task and their defaults (what ``--option key=value`` may set)."""
    params = inspect.signature(TASKS.get(task)).parameters
    return {name: p.default for name, p in params.items() if name not in ("num", "seed", "split")}


def generate(task: str, num: int, seed: int, split: str = "train", **options) -> list[dict]:
    """Rows of a registered task; unknown tasks and options fail naming the known ones."""
    known = task_options(task)
    for key in options:
        if key not in known:
            raise DataError(f"{task}: unknown option {key!r}; {TASKS.suggestion(key, tuple(known))}")
    if split not in SPLIT_DEFAULTS:
        raise DataError(f"{task}: split must be one of {sorted(SPLIT_DEFAULTS)}, got {split!r}")
    if not isinstance(num, int) or num < 1:
        raise DataError(f"{task}: num must be a positive number of rows, got {num!r}")
    return TASKS.get(task)(num, seed, split=split, **options)


def write_parquet(rows: list[dict], path: str | os.PathLike) -> Path:
    """Write rows to ``path`` atomically: a temp file in the same directory, then ``os.replace``, so
    readers never see a half-written file and a failed write leaves nothing behind."""
    import pandas as pd

    if not rows:
        raise DataError(f"{path}: no rows to write")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pd.DataFrame(rows).to_parquet(tmp, index=False)
        plain_modes(tmp)  # as a plainly created file (mkstemp makes it private)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def default_cache_dir() -> Path:
    return Path(os.environ.get("RLPLAT_CACHE") or Path.home() / ".cache" / "rlplat")


def task_digest(task: str) -> str:
    """A digest of a registered task's generator source: part of the name of its cached files, so a
    changed generator never reads rows an older one wrote."""
    return hashlib.sha256(inspect.getsource(TASKS.get(task)).encode()).hexdigest()[:8]


def builtin_path(task: str, split: str, cache_dir: str | os.PathLike | None = None, num: int | None = None,
                 seed: int | None = None) -> Path:
    """The parquet of a built-in task's split under ``<cache_dir>/data/``, generated only if missing.

    Defaults: ``train`` 20,000 rows (:data:`TRAIN_ROWS` for some tasks) with seed 0, ``test`` 256 rows with
    seed 1; ``cache_dir`` defaults to ``$RLPLAT_CACHE`` or ``~/.cache/rlplat``; the name ends with
    :func:`task_digest`.
    """
    if split not in SPLIT_DEFAULTS:
        raise DataError(f"builtin:{task}: split must be one of {sorted(SPLIT_DEFAULTS)}, got {split!r}")
    default_num, default_seed = SPLIT_DEFAULTS[split]
    if split == "train":
        default_num = TRAIN_ROWS.get(task, default_num)
    num = default_num if num is None else num
    seed = default_seed if seed is None else seed
    path = Path(cache_dir or default_cache_dir()) / "data" / f"{task}-{split}-{num}-{seed}-{task_digest(task)}.parquet"
    if not path.exists():
        write_parquet(generate(task, num, seed, split=split), path)
    return path


def resolve_files(paths: str | os.PathLike | Iterable[str | os.PathLike], split: str) -> list[str]:
    """Files named by ``data.train_files`` (``split="train"``) or ``data.val_files`` (``split="test"``):
    ``builtin:<task>`` entries become cached parquet files; every other entry must be an existing file."""
    key = SPLIT_KEYS.get(split, "data.val_files")
    entries = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not entries:
        raise DataError(f"{key}: no files given; pass parquet paths or builtin:<task> ({', '.join(TASKS.names())})")
    out = []
    for entry in map(str, entries):
        if entry.startswith("builtin:"):
            try:
                out.append(str(builtin_path(entry.removeprefix("builtin:"), split)))
            except RegistryError as err:
                raise DataError(f"{key}: {err}") from None
        elif not Path(entry).is_file():
            raise DataError(f"{key}: no such parquet file {entry!r}")
        else:
            out.append(entry)
    return out


# --------------------------------------------------------------------------------------------------- CLI
def _parse_option(task: str, text: str) -> tuple[str, object]:
    """``key=value`` with the value typed like the option's default (bool, int or str)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise DataError(f"--option {text!r}: expected key=value")
    default = task_options(task).get(key)
    if isinstance(default, bool):
        if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise DataError(f"--option {text!r}: {key} expects true or false")
        return key, value.lower() in ("true", "1", "yes")
    if isinstance(default, int):
        try:
            return key, int(value)
        except ValueError:
            raise DataError(f"--option {text!r}: {key} expects an integer") from None
    return key, value


def write_rows_command(make: Callable[[], list[dict]], out: str, what: str) -> int:
    """The end of a data command: the rows ``make`` builds, written to ``out``, and one line saying so (``wrote N
    <what> to <path>``); when building them fails on bad input, one ``error:`` line, nothing written, exit 2."""
    try:
        rows = make()
    except (DataError, RegistryError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {len(rows)} {what} to {write_parquet(rows, out)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlplat.data.synthetic", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, help=f"one of: {', '.join(TASKS.names())}")
    parser.add_argument("--out", required=True, help="parquet file to write (parent folders are created)")
    parser.add_argument("--num", type=int, default=1000, help="rows (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default="train", choices=sorted(SPLIT_DEFAULTS),
                        help="test rows never repeat a train problem (arithmetic)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="task option, repeatable (arithmetic: digits, ops; countdown: count, max_number, "
                             "think_format)")
    args = parser.parse_args(argv)

    def make() -> list[dict]:
        options = dict(_parse_option(args.task, text) for text in args.option)
        return generate(args.task, args.num, args.seed, split=args.split, **options)

    return write_rows_command(make, args.out, f"rows of {args.task} ({args.split}, seed {args.seed})")


if __name__ == "__main__":
    sys.exit(main())
