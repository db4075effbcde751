"""Countdown (Jiayi-Pan/Countdown-Tasks-3to4, as in TinyZero) -> rlplat parquet.

    python examples/data_preprocess/countdown.py --out-dir data/countdown   # from the hub (train split only:
                                                                            # the last --test-size rows are test)
    python examples/data_preprocess/countdown.py --train-file train.jsonl --test-file test.jsonl

Original rows: ``{"target": int, "nums": [int, ...]}``. Rows get ``data_source: rlplat/countdown`` with
``extra_info.numbers`` / ``extra_info.target``, scored by rlplat's ``countdown`` reward (the expression in
the last ``<answer>…</answer>`` must use each number once and equal the target).
"""

import sys

from preprocess_common import PreprocessError, column, parser, read_hub, rlhf_row, run

TEMPLATE = ("Using the numbers {numbers}, create an equation that equals {target}. You can use basic arithmetic "
            "operations (+, -, *, /) and each number can only be used once. Show your work in <think> </think> "
            "tags. And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 "
            "</answer>.")


def to_row(row: dict, where: str, split: str, index: int) -> dict:
    target, nums = column(row, "target", where), column(row, "nums", where)
    try:
        numbers, target = [int(n) for n in nums], int(target)
    except (TypeError, ValueError):
        raise PreprocessError(f"{where}: 'nums' must be a list of integers and 'target' an integer") from None
    content = TEMPLATE.format(numbers=numbers, target=target)
    return rlhf_row("rlplat/countdown", content, str(target), split, index, numbers=numbers, target=target)


if __name__ == "__main__":
    p = parser(__doc__.splitlines()[0], "Jiayi-Pan/Countdown-Tasks-3to4", "data/countdown")
    p.add_argument("--test-size", type=int, default=1024, help="hub mode: rows held out as the test split")
    args = p.parse_args()
    # The hub dataset has one split: hold out its last --test-size rows (deterministic, no overlap).

    def hub_rows(name, config, split):
        rows = read_hub(name, config, "train")
        return rows[:-args.test_size] if split == "train" else rows[-args.test_size:]

    sys.exit(run(args, to_row, hub_reader=hub_rows))
