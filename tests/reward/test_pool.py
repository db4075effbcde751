"""The reward process pool (``reward.num_workers``): concurrent calls with their own deadlines, an early stop
when rewards hang or fail, a run that stops with one line (validation too), and worker processes that die
with their trainer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from processes import all_gone, children

from rlplat.reward import build_reward_manager
from rlplat.reward.errors import RewardsFailing

HANGS = "import time\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" \
        "    time.sleep(3600)\n"
WAITS = "import time\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" \
        "    time.sleep(0.02)\n    return float(solution_str == ground_truth)\n"


def _manager(tmp_path, source: str, **reward):
    path = tmp_path / "my_reward.py"
    path.write_text(source)
    return build_reward_manager({"custom_fn": {"path": str(path)}, **reward})


def _score(manager, n: int):
    return manager.score(["7"] * n, ["s"] * n, ["7"] * n, [{}] * n, [1] * n)


def test_a_reward_that_hangs_everywhere_stops_the_batch_after_one_timeout(tmp_path):
    """24 samples, reward.timeout_s=3, 4 workers: one round of timeouts (~3 s), not 24 x 3 s, and each call
    waited for its own deadline, not twice it. The 4 processes are started (and have answered) before the
    clock starts, so the seconds are the calls' and not the processes' start-up."""
    manager = _manager(tmp_path, "import time\n\ndef compute_score(data_source, solution_str, ground_truth, "
                       "extra_info=None):\n    if solution_str == 'warm':\n        return 0.0\n"
                       "    time.sleep(3600)\n", timeout_s=3, num_workers=4)
    try:
        for worker in manager.executor.workers:
            worker.ensure_started()
        manager.score(["warm"] * 4, ["s"] * 4, ["7"] * 4, [{}] * 4, [1] * 4)
        start = time.monotonic()
        with pytest.raises(RewardsFailing, match="the first call in each of the 4 reward processes timed out"):
            _score(manager, 24)
        elapsed = time.monotonic() - start
    finally:
        manager.close()
    assert 3.0 <= elapsed < 5.5, elapsed  # a deadline twice reward.timeout_s would take >= 6 s


def test_calls_run_concurrently(tmp_path):
    """1,000 calls of a reward that waits 20 ms (20 s one after another) on 4 workers take under 40% of that."""
    manager = _manager(tmp_path, WAITS, num_workers=4)
    try:
        _score(manager, 4)  # the processes start
        start = time.monotonic()
        result = _score(manager, 1000)
        elapsed = time.monotonic() - start
    finally:
        manager.close()
    assert result.scores == [1.0] * 1000 and result.num_errors == 0
    print(f"1000 calls of 20 ms on 4 workers: {elapsed:.2f} s (serial >= 20 s)")
    assert elapsed < 0.4 * 1000 * 0.020


def test_enough_failures_stop_a_batch_early(tmp_path):
    """With reward.fail_fraction_to_stop=0.25 the batch stops once a quarter of its calls failed."""
    manager = _manager(tmp_path, "def compute_score(*args, **kwargs):\n    raise ValueError('no')\n",
                       num_workers=2, fail_fraction_to_stop=0.25)
    try:
        with pytest.raises(RewardsFailing, match=r"failed calls after \d+ of 100 calls") as err:
            _score(manager, 100)
        assert 25 <= err.value.errors < 100 and "raised ValueError: no" in err.value.first_error
    finally:
        manager.close()


KILLED_TRAINER = """
import sys
from rlplat.reward import build_reward_manager
manager = build_reward_manager({"custom_fn": {"path": sys.argv[1]}, "timeout_s": 600, "num_workers": 2})
print("scoring", flush=True)
manager.score(["7"] * 4, ["s"] * 4, ["7"] * 4, [{}] * 4, [1] * 4)
"""


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_reward_processes_die_with_a_killed_trainer(tmp_path):
    """kill -9 of the trainer while its rewards hang: no reward process is left 5 s later."""
    path = tmp_path / "my_reward.py"
    path.write_text(HANGS)
    trainer = subprocess.Popen([sys.executable, "-c", KILLED_TRAINER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert trainer.stdout.readline().strip() == "scoring"
        deadline = time.monotonic() + 60
        while len(workers := children(trainer.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(workers) == 2
        time.sleep(0.5)  # inside the hanging reward
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    assert all_gone(workers, within_s=5), "a reward process outlived its trainer"


@pytest.mark.slow
def test_a_validation_whose_rewards_all_fail_stops_the_run_with_one_line(tmp_path, embedded_cache, small_val, capsys):
    from rlplat.trainer.main import main

    path = tmp_path / "my_reward.py"
    path.write_text("def compute_score(*args, **kwargs):\n    raise ValueError('no reward today')\n")
    code = main(["algorithm=grpo", "trainer.ray_address=inprocess", f"trainer.output_dir={tmp_path / 'run'}",
                 f"data.val_files={small_val}", f"reward.custom_fn.path={path}", "trainer.total_steps=2"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rlplat:")]
    assert code == 1
    assert err == [err[0]] and err[0].startswith("rlplat: validation at step 0: 32 of 32 reward calls failed")
    assert "its accuracy would be meaningless" in err[0] and "raised ValueError: no reward today" in err[0]


def test_a_config_error_in_one_call_stops_every_worker_and_the_pool_stays_usable(tmp_path):
    """An unknown data_source is the config's fault, not a sample's: it is raised once the other calls in
    flight finished, and the next batch runs on the same processes."""
    from rlplat.reward import UnknownDataSourceError

    manager = build_reward_manager({"functions": ["auto"], "num_workers": 2})
    try:
        sources = ["rlplat/arithmetic"] * 9 + ["nowhere"]
        with pytest.raises(UnknownDataSourceError, match="'nowhere'"):
            manager.score(["7"] * 10, sources, ["7"] * 10, [{}] * 10, [1] * 10)
        assert manager.score(["7", "8"], ["rlplat/arithmetic"] * 2, ["7"] * 2, [{}] * 2, [1, 1]).scores == [1.0, 0.0]
    finally:
        manager.close()
