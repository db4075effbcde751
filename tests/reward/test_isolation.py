"""Reward results are checked, and reward code runs in a worker process with a per-call timeout."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from rlplat.reward import RewardManager, build_reward_manager
from rlplat.reward.errors import BadRewardValue
from rlplat.reward.calls import RewardValue, check_result
from rlplat.trainer.metrics import validation_metrics

ROW = ("src", "text", "42", {})


def returns(value):
    def fixed(data_source, solution_str, ground_truth, extra_info=None):
        return value
    return fixed


@pytest.mark.parametrize("value", [None, "1.0", math.nan, math.inf, -math.inf, [1.0], (1.0,), {"acc": 1.0},
                                   {"score": "1"}, {"score": 1.0, "acc": math.nan}, object()])
def test_bad_return_values_are_errors_naming_function_sample_and_value(value):
    with pytest.raises(BadRewardValue) as err:
        check_result(value, "my_reward", 7, ROW)
    first = str(err.value).splitlines()[0]
    assert "'my_reward'" in first and "sample 7" in first and "'42'" in first
    shown = repr(value)[:20] if not isinstance(value, dict) else "score" if "score" in value else "without 'score'"
    assert shown in first


@pytest.mark.parametrize("value, expected", [
    (1, RewardValue(1.0)), (True, RewardValue(1.0)), (np.float32(0.5), RewardValue(0.5)),
    ({"score": 0.3, "acc": 1, "pred": "7", "len_bonus": 0.1}, RewardValue(0.3, 1.0, {"len_bonus": 0.1})),
])
def test_good_return_values(value, expected):
    assert check_result(value, "f", 0, ROW) == expected


def test_dict_rewards_give_scores_acc_and_extra_metrics():
    def shaped(data_source, solution_str, ground_truth, extra_info=None):
        ok = solution_str == ground_truth
        return {"score": (1.0 if ok else 0.0) + 0.25, "acc": float(ok), "format": 0.25}

    result = RewardManager([(shaped, 1.0)]).score(["7", "8"], ["s", "s"], ["7", "7"], [{}, {}], [1, 1])
    assert result.scores == [1.25, 0.25] and result.acc == [1.0, 0.0] and result.correct() == [1.0, 0.0]
    assert result.extras == {"shaped/format": [0.25, 0.25]} and result.accuracy_source == "acc"


def test_validation_accuracy_uses_acc_with_a_shaped_reward():
    # a shaped reward below 1 for every sample: the score >= 1 rule would read 0, acc says half are right
    scores, acc = [0.9, 0.4, 0.9, 0.4], [1.0, 0.0, 1.0, 0.0]
    m = validation_metrics(["s"] * 4, ["p0", "p0", "p1", "p1"], ["a", "b", "a", "b"], scores, acc)
    assert m["val/accuracy"] == 0.5 and m["val/s/pass@2"] == 1.0
    assert validation_metrics(["s"] * 4, ["p0", "p0", "p1", "p1"], ["a"] * 4, scores)["val/accuracy"] == 0.0


def test_float_rewards_use_the_documented_score_rule():
    result = RewardManager([(returns(1.0), 1.0)]).score(["a", "b"], ["s"] * 2, ["a"] * 2, [{}] * 2, [1, 1])
    assert result.correct() == [1.0, 1.0] and result.accuracy_source == "score>=1"


HANGS_AND_CRASHES = '''
import os, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "hang":
        time.sleep(600)
    if solution_str == "crash":
        os._exit(3)
    if solution_str == "none":
        return None
    return {"score": float(solution_str == ground_truth), "acc": float(solution_str == ground_truth)}
'''


def test_worker_process_survives_hangs_crashes_and_bad_values(tmp_path, capsys):
    path = tmp_path / "reward.py"
    path.write_text(HANGS_AND_CRASHES)
    manager = build_reward_manager({"custom_fn": {"path": str(path)}, "timeout_s": 1.0})
    try:
        texts = ["7", "hang", "7", "crash", "none", "8", "7"]
        result = manager.score(texts, ["s"] * 7, ["7"] * 7, [{}] * 7, [1] * 7)
        assert result.scores == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
        assert result.num_errors == 3 and result.num_calls == 7
        assert "did not return within reward.timeout_s=1 s" in result.first_error
        assert "'compute_score' on sample 1" in result.first_error
        err = capsys.readouterr().err
        assert "reward.timeout_s" in err and err.count("[rlplat.reward]") == 2  # the first error only
        again = manager.score(["crash"], ["s"], ["7"], [{}], [1])  # a crash is counted, never fatal
        assert again.num_errors == 1 and "killed the reward worker process (exit code 3), and again when made " \
            "once more in a fresh one" in again.first_error
    finally:
        manager.close()


DIES_ONCE = '''
import os
from pathlib import Path

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    marker = Path(MARKERS) / solution_str
    if not marker.exists():  # the first call of each sample: its process is killed, as the OOM killer would
        marker.touch()
        os.kill(os.getpid(), 9)
    return float(solution_str == ground_truth)
'''


@pytest.mark.parametrize("workers", [1, 2])
def test_a_call_whose_process_is_killed_is_made_again_in_a_fresh_one(tmp_path, workers):
    path = tmp_path / "reward.py"
    (tmp_path / "markers").mkdir()
    path.write_text(f"MARKERS = {str(tmp_path / 'markers')!r}\n" + DIES_ONCE)
    manager = build_reward_manager({"custom_fn": {"path": str(path)}, "num_workers": workers})
    try:
        result = manager.score(["7", "8", "7x"], ["s"] * 3, ["7", "8", "9"], [{}] * 3, [1] * 3)
        assert result.scores == [1.0, 1.0, 0.0] and result.num_errors == 0  # each killed once, then scored
        assert sorted(p.name for p in (tmp_path / "markers").iterdir()) == ["7", "7x", "8"]
    finally:
        manager.close()


def test_the_reward_worker_process_does_not_load_torch(tmp_path):
    # reward code needs no torch; loading it would cost every worker process ~230 MB and a second
    path = tmp_path / "reward.py"
    path.write_text("import sys\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    return float('torch' in sys.modules)\n")
    manager = build_reward_manager({"custom_fn": {"path": str(path)}})
    try:
        assert manager.score(["7"], ["s"], ["7"], [{}], [1]).scores == [0.0]
    finally:
        manager.close()


def _child_pids() -> list[int]:
    """This process's live children (from /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                pids.append(int(entry))
    return pids


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_training_and_validation_share_the_worker_processes_and_only_training_is_shaped():
    overlong = {"enable": True, "length": 4, "penalty_factor": 1.0}
    train = build_reward_manager({"functions": ["arithmetic"], "num_workers": 2}, overlong, 8)
    val = train.for_validation()
    before = set(_child_pids())
    try:
        args = (["7", "7"], ["s"] * 2, ["7"] * 2, [{}] * 2, [2, 8])  # the second response is at the length limit
        assert train.score(*args).scores == [1.0, 0.0]
        assert val.score(*args).scores == [1.0, 1.0]
        assert len(set(_child_pids()) - before) == 2  # the pool's two; no multiprocessing resource tracker either
    finally:
        train.close()
        val.close()
    assert set(_child_pids()) - before == set()


SCRIPT = '''
import os

from rlplat.reward import RewardManager, build_reward_manager

print("top level ran", flush=True)


def mine(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)


def score(manager):
    try:
        print(manager.score(["7", "8"], ["s", "s"], ["7", "7"], [{}, {}], [1, 1]).scores, flush=True)
    finally:
        manager.close()


MODE = os.environ["MODE"]  # the worker process inherits it
if MODE == "unguarded":
    score(RewardManager([(mine, 1.0)], isolation="process"))
if __name__ == "__main__":
    if MODE == "script":
        score(RewardManager([(mine, 1.0)], isolation="process"))
    if MODE == "builtin":
        score(build_reward_manager({"functions": ["arithmetic"]}))
'''


def test_a_function_of_the_running_script_is_loaded_by_running_the_script_again(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)

    def run(mode):
        return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "MODE": mode})

    builtin = run("builtin")  # nothing of the script is needed: the worker does not run it
    assert builtin.returncode == 0, builtin.stderr
    assert builtin.stdout.count("top level ran") == 1 and "[1.0, 0.0]" in builtin.stdout
    own = run("script")  # the worker runs the script's top level (not its __main__ part) to load ``mine``
    assert own.returncode == 0, own.stderr
    assert own.stdout.count("top level ran") == 2 and own.stdout.count("[1.0, 0.0]") == 1
    unguarded = run("unguarded")  # starting a run at the top level would start it again in the worker
    assert unguarded.returncode != 0 and "[1.0, 0.0]" not in unguarded.stdout
    assert 'could not load the reward functions' in unguarded.stderr
    assert 'under `if __name__ == "__main__":`' in unguarded.stderr
