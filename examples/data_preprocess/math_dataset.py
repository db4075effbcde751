"""MATH (hendrycks competition math; hub default DigitalLearningGmbH/MATH-lighteval) or MATH-500 -> rlplat parquet.

    python examples/data_preprocess/math_dataset.py --dataset HuggingFaceH4/MATH-500 --hub-splits test test --out-dir data/math500
    python examples/data_preprocess/math_dataset.py --train-file train.jsonl --test-file test.jsonl

Original rows: hendrycks ``{"problem", "level", "type", "solution"}`` with the answer in the solution's
last ``\\boxed{}``; MATH-500 ``{"problem", "solution", "answer", "subject", "level", "unique_id"}``.
The ground truth is ``answer`` when present, else the solution's last ``\\boxed{}``. Rows get
``data_source: math`` (scored by rlplat's ``math`` reward: the response's last ``\\boxed{}``).
MATH-500 has only a ``test`` split on the hub; use ``--hub-splits test test`` or local files.
"""

import sys

from preprocess_common import PreprocessError, column, parser, rlhf_row, run

from rlplat.reward.scorers import last_boxed

INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def to_row(row: dict, where: str, split: str, index: int) -> dict:
    problem = column(row, "problem", where)
    solution = column(row, "solution", where)
    answer = row.get("answer") or last_boxed(str(solution))
    if not answer:
        raise PreprocessError(f"{where}: no 'answer' column and column 'solution' has no \\boxed{{}} answer")
    extra = {k: str(row[k]) for k in ("level", "type", "subject", "unique_id") if row.get(k) is not None}
    return rlhf_row("math", f"{problem} {INSTRUCTION}", answer, split, index, solution=solution, **extra)


if __name__ == "__main__":
    p = parser(__doc__.splitlines()[0], "DigitalLearningGmbH/MATH-lighteval", "data/math")
    p.add_argument("--hub-splits", nargs=2, default=["train", "test"], metavar=("TRAIN", "TEST"),
                   help="hub split names to read as train and test")
    args = p.parse_args()
    sys.exit(run(args, to_row, tuple(args.hub_splits)))
