"""reasoning-gym tasks as rlplat data: procedurally generated, verifiable reasoning problems.

    python -m rlplat.data.reasoning_gym --task chain_sum --num 2000 --out data/chain_sum.parquet
    python -m rlplat.data.reasoning_gym --task leg_counting --num 256 --seed 1 --out data/legs_test.parquet
    python -m rlplat.data.reasoning_gym --task basic_arithmetic --option max_terms=3 --out data/ba.parquet
    python -m rlplat.data.reasoning_gym --list

reasoning-gym (``pip install -e '.[envs]'``) generates each task's problems from a seed; ``--option``
sets a field of the task's config (``--option min_terms=2``; values are read as JSON, else kept as text).
Each row is in the common RLHF schema: ``data_source`` ``reasoning_gym/<task>``, the prompt (reasoning-gym's
system prompt ``--system-prompt``, ``default`` unless told, then the question), ``reward_model.ground_truth``
the entry's answer (empty for tasks with many right answers, which the scorer checks instead), and the whole
generated entry in ``extra_info["reasoning_gym_entry"]`` (JSON): the reward of these rows is the task's own
``score_answer`` on the last ``<answer>...</answer>`` of the response (:mod:`rlplat.reward.reasoning_gym`;
``reward.functions=[auto]`` picks it from the data_source).
"""

from __future__ import annotations

import argparse
import json
import sys

from rlplat.data.synthetic import DataError, write_rows_command

ENTRY_KEY = "reasoning_gym_entry"  # extra_info key of the generated entry (a JSON string): what the scorer reads
PREFIX = "reasoning_gym/"  # the rows' data_source is PREFIX + the task
INSTALL = "pip install -e '.[envs]'"


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError:
        raise DataError(f"reasoning-gym tasks need the package 'reasoning_gym', which is not installed; "
                        f"install it with: {INSTALL}") from None
    return reasoning_gym


def task_names() -> list[str]:
    _reasoning_gym()
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def _entry_json(task: str, index: int, entry: dict) -> str:
    try:
        return json.dumps(entry, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise DataError(f"reasoning-gym task {task!r}: entry {index} does not convert to JSON ({err}); rlplat "
                        f"stores the entry its scorer reads as JSON, so this task cannot be written") from None


def rows(task: str, num: int, seed: int = 0, system_prompt: str | None = "default", split: str = "train",
         **options) -> list[dict]:
    """``num`` rows of reasoning-gym's ``task`` generated from ``seed`` (see the module doc)."""
    rg = _reasoning_gym()
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if task not in task_names():
        raise DataError(f"--task {task!r} is not a reasoning-gym task; see python -m rlplat.data.reasoning_gym --list")
    if system_prompt is not None and system_prompt not in SYSTEM_PROMPTS:
        raise DataError(f"--system-prompt {system_prompt!r}: expected one of {sorted(SYSTEM_PROMPTS)} or none")
    if num < 1:
        raise DataError(f"--num must be at least 1, got {num}")
    try:
        dataset = rg.create_dataset(task, size=num, seed=seed, **options)
    except (TypeError, ValueError, AssertionError) as err:  # an unknown or invalid config field
        raise DataError(f"reasoning-gym task {task!r} with options {options}: {type(err).__name__}: {err}") from None
    system = [{"role": "system", "content": SYSTEM_PROMPTS[system_prompt]}] if system_prompt else []
    out = []
    for index in range(num):
        entry = dataset[index]
        answer = entry.get("answer")
        out.append({
            "data_source": PREFIX + task,
            "prompt": system + [{"role": "user", "content": entry["question"]}],
            "ability": "reasoning",
            "reward_model": {"style": "rule", "ground_truth": "" if answer is None else str(answer)},
            "extra_info": {"index": index, "split": split, "seed": seed, ENTRY_KEY: _entry_json(task, index, entry)},
        })
    return out


def _option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise DataError(f"--option {text!r}: expected key=value")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlplat.data.reasoning_gym", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", help="a reasoning-gym task (--list shows them)")
    parser.add_argument("--out", help="parquet file to write (parent folders are created)")
    parser.add_argument("--num", type=int, default=1000, help="rows (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="generation seed: use another for a test split")
    parser.add_argument("--split", default="train", help="written to extra_info.split (default train)")
    parser.add_argument("--system-prompt", default="default",
                        help="reasoning-gym's system prompt by name (default, DeepSeekZero, simple, direct, "
                             "chain_of_draft) or none")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a field of the task's config, repeatable")
    parser.add_argument("--list", action="store_true", help="print the task names and exit")
    args = parser.parse_args(argv)
    if args.list:
        try:
            print("\n".join(task_names()))
        except DataError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    if not args.task or not args.out:
        parser.error("--task and --out are required (or --list)")

    def make() -> list[dict]:
        options = dict(_option(text) for text in args.option)
        system = None if args.system_prompt.lower() == "none" else args.system_prompt
        return rows(args.task, args.num, args.seed, system, args.split, **options)

    return write_rows_command(make, args.out, f"rows of reasoning-gym's {args.task} (seed {args.seed})")


if __name__ == "__main__":
    sys.exit(main())
