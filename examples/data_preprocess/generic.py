"""Any question/answer table -> rlplat parquet.

    python examples/data_preprocess/generic.py --train-file qa_train.jsonl --test-file qa_test.jsonl \
        --question-key question --answer-key answer --data-source gsm8k --out-dir data/qa
    python examples/data_preprocess/generic.py --dataset some/hub-dataset --question-key input --answer-key target \
        --data-source math --instruction "Put the final answer in \\boxed{}."

``--data-source`` picks the reward rlplat uses (``gsm8k``: number after ``####``; any name containing
``math``: last ``\\boxed{}``; or your own with ``reward.custom_fn.path=...``). Other columns are kept in
``extra_info``.
"""

import sys

from preprocess_common import column, parser, rlhf_row, run


def main() -> int:
    p = parser(__doc__.splitlines()[0], None, "data/qa")
    p.add_argument("--question-key", default="question", help="column with the question")
    p.add_argument("--answer-key", default="answer", help="column with the reference answer")
    p.add_argument("--data-source", required=True, help="data_source of every row (picks the reward)")
    p.add_argument("--instruction", default="", help="text appended to every question")
    p.add_argument("--hub-splits", nargs=2, default=["train", "test"], metavar=("TRAIN", "TEST"))
    args = p.parse_args()

    def to_row(row: dict, where: str, split: str, index: int) -> dict:
        question = str(column(row, args.question_key, where))
        answer = column(row, args.answer_key, where)
        content = f"{question} {args.instruction}".strip()
        extra = {k: str(v) for k, v in row.items() if k not in (args.question_key, args.answer_key)}
        return rlhf_row(args.data_source, content, str(answer), split, index, **extra)

    return run(args, to_row, tuple(args.hub_splits))


if __name__ == "__main__":
    sys.exit(main())
