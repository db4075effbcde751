"""GSM8K (openai/gsm8k, config 'main') -> rlplat parquet.

    python examples/data_preprocess/gsm8k.py --out-dir data/gsm8k                    # from the hub
    python examples/data_preprocess/gsm8k.py --train-file train.jsonl --test-file test.jsonl

Original rows: ``{"question": str, "answer": "<reasoning> #### 72"}``. The ground truth is the number after
``####``; rows get ``data_source: openai/gsm8k``, scored by rlplat's ``gsm8k`` reward (the last ``####``
in the response).
"""

import re
import sys

from preprocess_common import PreprocessError, column, parser, rlhf_row, run

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_FINAL = re.compile(r"####\s*(-?[\d,.$]+)")


def final_answer(solution: str, where: str) -> str:
    found = _FINAL.findall(str(solution))
    if not found:
        raise PreprocessError(f"{where}: column 'answer' has no '#### <number>' final answer")
    return found[-1].replace(",", "").replace("$", "").rstrip(".")


def to_row(row: dict, where: str, split: str, index: int) -> dict:
    question = column(row, "question", where)
    solution = column(row, "answer", where)
    return rlhf_row("openai/gsm8k", f"{question} {INSTRUCTION}", final_answer(solution, where), split, index,
                    answer=solution, question=question)


if __name__ == "__main__":
    args = parser(__doc__.splitlines()[0], "openai/gsm8k", "data/gsm8k").parse_args()
    args.config = args.config or "main"
    sys.exit(run(args, to_row))
