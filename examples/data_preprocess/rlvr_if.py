"""open-instruct's RLVR rows (its instruction-following sets: allenai/RLVR-IFeval's newer form,
allenai/IF_multi_constraints_upto5, and the ifeval rows of its mixtures) -> rlplat parquet.

    python examples/data_preprocess/rlvr_if.py --dataset allenai/IF_multi_constraints_upto5 --hub-splits train train
    python examples/data_preprocess/rlvr_if.py --train-file if_train.jsonl --test-file if_test.jsonl --out-dir data/if

Original rows: ``{"messages": [{"role": "user", "content": ...}], "ground_truth": str, "dataset": "ifeval"}``,
the ground truth being the instruction ids and their arguments (``"[{'instruction_id': [...], 'kwargs': [...]}]"``).
The messages up to the last user turn become the prompt, the ``dataset`` column the ``data_source`` (``ifeval``:
scored by rlplat's ``ifeval`` reward, IFEval's checks; other verifiers' rows keep their name), the ground truth
is kept as it is, after checking that an ifeval row's constraints parse and name IFEval's instruction types.
"""

import sys

from preprocess_common import PreprocessError, column, parser, run

from rlplat.reward.ifeval import constraints


def main() -> int:
    p = parser(__doc__.splitlines()[0], "allenai/IF_multi_constraints_upto5", "data/rlvr_if")
    p.add_argument("--hub-splits", nargs=2, default=["train", "test"], metavar=("TRAIN", "TEST"))
    args = p.parse_args()

    def to_row(row: dict, where: str, split: str, index: int) -> dict:
        messages = [dict(m) for m in column(row, "messages", where)]
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if not users:
            raise PreprocessError(f"{where}: column 'messages' has no user turn")
        ground_truth = str(column(row, "ground_truth", where))
        source = str(row.get("dataset") or "ifeval")
        if source == "ifeval":
            try:
                ids, _ = constraints(ground_truth)
            except (ValueError, ModuleNotFoundError) as err:
                raise PreprocessError(f"{where}: column 'ground_truth': {err}") from None
        extra = {key: str(row[key]) for key in ("constraint_type", "constraint") if row.get(key) is not None}
        return {"data_source": source, "prompt": messages[:users[-1] + 1], "ability": "instruction_following",
                "reward_model": {"style": "rule", "ground_truth": ground_truth},
                "extra_info": {"split": split, "index": index, **extra}}

    return run(args, to_row, tuple(args.hub_splits))


if __name__ == "__main__":
    sys.exit(main())
