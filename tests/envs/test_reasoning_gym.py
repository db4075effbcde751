"""reasoning-gym tasks as data: the rows' reward is reasoning-gym's own ``score_answer``, row for row, and a
short training run on them reports it."""

import pandas as pd
import pytest

from rlplat.data.reasoning_gym import main as reasoning_gym_cli
from rlplat.reward import REWARD_FUNCTIONS, UnknownDataSourceError

reasoning_gym = pytest.importorskip("reasoning_gym", reason="the envs extra: pip install -e '.[envs]'")


def responses(task, entry, index):
    """Right and wrong answers, in the forms a model writes them (tags, a box, nothing, tags after a box)."""
    right = entry["metadata"]["example_answer"] if task == "propositional_logic" else entry["answer"]
    wrong = {"chain_sum": lambda: str(int(entry["answer"]) + 1), "spell_backward": lambda: entry["answer"] + "x",
             "propositional_logic": lambda: "P"}[task]()
    forms = [f"<think>so</think>\n<answer>{right}</answer>", f"<answer> {wrong} </answer>",
             f"the answer is \\boxed{{{right}}}", f"{right}", f"<answer>{wrong}</answer> no, <answer>{right}</answer>",
             "\\boxed{" + wrong + "}"]
    return forms[index % len(forms)]


@pytest.mark.parametrize("task", ["chain_sum", "spell_backward", "propositional_logic"])
def test_the_reward_of_written_rows_is_reasoning_gyms_score_answer(task, tmp_path):
    from reasoning_gym.factory import get_score_answer_fn
    from reasoning_gym.utils import extract_answer

    from rlplat.reward import last_boxed

    out = tmp_path / f"{task}.parquet"
    assert reasoning_gym_cli(["--task", task, "--num", "200", "--seed", "3", "--out", str(out)]) == 0
    rows = pd.read_parquet(out).to_dict("records")
    entries = list(reasoning_gym.create_dataset(task, size=200, seed=3))  # what the scorer is meant to read
    score_answer, auto = get_score_answer_fn(task), REWARD_FUNCTIONS.get("auto")
    ours, theirs = [], []
    for index, (row, entry) in enumerate(zip(rows, entries)):
        assert row["data_source"] == f"reasoning_gym/{task}" and row["prompt"][-1]["content"] == entry["question"]
        text = responses(task, entry, index)
        ours.append(auto(row["data_source"], text, row["reward_model"]["ground_truth"], dict(row["extra_info"])))
        answer = extract_answer(text)
        theirs.append(float(score_answer(answer if answer is not None else last_boxed(text), entry)))
    assert ours == theirs
    assert 0 < sum(ours) < len(ours)  # right and wrong answers both scored


def test_a_short_run_on_a_reasoning_gym_task_reports_its_reward(embedded_cache, tmp_path):
    from rlplat.trainer.run import load_run_config, run
    from tests.trainer.test_trainer import metrics, overrides

    for name, seed, num in (("train", 0, 32), ("val", 1, 8)):
        assert reasoning_gym_cli(["--task", "chain_sum", "--option", "max_terms=2", "--option", "max_digits=1",
                                  "--system-prompt", "none", "--num", str(num), "--seed", str(seed),
                                  "--out", str(tmp_path / f"{name}.parquet")]) == 0
    out = tmp_path / "run"
    cfg, plan = load_run_config(overrides(out, 2, tmp_path / "val.parquet",
                                          f"data.train_files={tmp_path}/train.parquet",
                                          "trainer.ray_address=inprocess"))
    run(cfg, plan)
    step = metrics(out)
    for s in (1, 2):  # every response scored by reasoning-gym's scorer, none failed
        assert step[s]["reward/num_errors"] == 0 and 0.0 <= step[s]["reward/auto_mean"] <= 1.0


def test_rows_without_the_entry_and_a_missing_package_are_one_line_each(monkeypatch):
    from rlplat.reward.reasoning_gym import ReasoningGymDataError

    auto = REWARD_FUNCTIONS.get("auto")
    with pytest.raises(ReasoningGymDataError, match=r"'reasoning_gym/chain_sum': the row has no "
                                                    r"extra_info\['reasoning_gym_entry'\]"):
        auto("reasoning_gym/chain_sum", "<answer>3</answer>", "3", {"index": 0})
    import sys

    from rlplat.reward.reasoning_gym import score_answer_fn

    score_answer_fn.cache_clear()
    monkeypatch.setitem(sys.modules, "reasoning_gym.factory", None)  # as if the package were not installed
    message = (r"^data_source 'reasoning_gym/chain_sum' is scored by reasoning-gym's score_answer, and the package "
               r"'reasoning_gym' is not installed; install it with: pip install -e '\.\[envs\]'$")
    with pytest.raises(UnknownDataSourceError, match=message):
        auto("reasoning_gym/chain_sum", "<answer>3</answer>", "3", {"reasoning_gym_entry": "{}"})


def test_the_cli_refuses_an_unknown_task_or_option_in_one_line(tmp_path, capsys):
    assert reasoning_gym_cli(["--task", "chain_summ", "--out", str(tmp_path / "x.parquet")]) == 2
    assert "'chain_summ' is not a reasoning-gym task" in capsys.readouterr().err
    assert reasoning_gym_cli(["--task", "chain_sum", "--option", "terms=3", "--out", str(tmp_path / "x.parquet")]) == 2
    assert "unexpected keyword argument 'terms'" in capsys.readouterr().err
    assert not (tmp_path / "x.parquet").exists()
