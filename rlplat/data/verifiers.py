"""A verifiers environment's dataset as rlplat rows.

    python -m rlplat.data.verifiers --env my-env --out data/my_env_train.parquet
    python -m rlplat.data.verifiers --env my-env --split eval --num 200 --out data/my_env_val.parquet
    python -m rlplat.data.verifiers --env envs/guess.py --env-args '{"max_number": 10}' --out data/guess.parquet

``--env`` is what ``rollout.agent.environment=verifiers:<env>`` names (an installed environment's id or
module, or a ``path/to/file.py`` defining ``load_environment``), ``--env-args`` its keyword arguments (JSON;
the run's ``rollout.agent.environment_args`` should be the same). Each row is the environment's own: the
prompt as the environment formats it (its system prompt and few-shot examples included), ``data_source``
``verifiers/<env>``, ``reward_model.ground_truth`` its answer, and the whole row (answer, info, task and
any other column its rubric reads) in ``extra_info["verifiers_row"]`` (JSON), which the run hands back to
the environment. The reward of these rows is the environment's rubric (``reward.functions=[auto]`` scores
them 0 and the rubric's terms add up to the reward; docs/environments.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlplat.agents.verifiers_env import ROW_KEY, load
from rlplat.config.errors import ConfigError
from rlplat.data.synthetic import DataError, write_rows_command


def source_name(env: str) -> str:
    """``verifiers/<env>``: the id, or a file's stem."""
    return "verifiers/" + (Path(env).stem if env.endswith(".py") else env)


def _message(message, where: str) -> dict:
    data = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else dict(message)
    if not isinstance(data.get("content"), str):
        raise DataError(f"{where}: a prompt message whose content is not text ({type(data.get('content')).__name__}); "
                        f"rlplat's rows hold text prompts")
    return {"role": data["role"], "content": data["content"]}


def rows(env: str, args: dict | None = None, split: str = "train", num: int = -1) -> list[dict]:
    """The environment's train (or ``eval``) rows in rlplat's schema (see the module doc)."""
    loaded = load(env, args)
    dataset = loaded.get_eval_dataset(n=num) if split == "eval" else loaded.get_dataset(n=num)
    out = []
    for index, row in enumerate(dataset):
        where = f"verifiers environment {env!r}, {split} row {index}"
        kept = {key: value for key, value in row.items() if key != "prompt"}
        try:
            text = json.dumps(kept, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise DataError(f"{where}: its columns do not convert to JSON ({err}); rlplat keeps the row as JSON "
                            f"for the environment") from None
        answer = row.get("answer")
        out.append({
            "data_source": source_name(env),
            "prompt": [_message(m, where) for m in row["prompt"]],
            "reward_model": {"style": "rule", "ground_truth": "" if answer is None else str(answer)},
            "extra_info": {"index": index, "split": split, ROW_KEY: text},
        })
    if not out:
        raise DataError(f"verifiers environment {env!r} has no {split} rows")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlplat.data.verifiers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", required=True, help="environment id, module or path/to/file.py")
    parser.add_argument("--env-args", default="{}", help="its load_environment keyword arguments, as JSON")
    parser.add_argument("--split", default="train", choices=["train", "eval"], help="its dataset or eval dataset")
    parser.add_argument("--num", type=int, default=-1, help="rows (default: all)")
    parser.add_argument("--out", required=True, help="parquet file to write (parent folders are created)")
    args = parser.parse_args(argv)

    def make() -> list[dict]:
        try:
            env_args = json.loads(args.env_args)
        except json.JSONDecodeError as err:
            raise DataError(f"--env-args is not JSON: {err}") from None
        if not isinstance(env_args, dict):
            raise DataError(f"--env-args must be a JSON object, got {args.env_args!r}")
        try:
            return rows(args.env, env_args, args.split, args.num)
        except ConfigError as err:  # the environment does not load
            raise DataError(str(err)) from None

    return write_rows_command(make, args.out, f"{args.split} rows of the verifiers environment {args.env}")


if __name__ == "__main__":
    sys.exit(main())
