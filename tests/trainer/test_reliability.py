"""Run-time failures end the run with one line: rewards that fail on a whole step, ..."""

import json
from pathlib import Path

from rlplat.trainer.main import main

SMALL = ["data.train_batch_size_prompts=4", "actor.mini_batch_size_prompts=4", "rollout.n=2",
         "rollout.val_n=1", "trainer.test_freq=0", "trainer.ray_address=inprocess"]


def test_a_step_where_every_reward_fails_stops_the_run(embedded_cache, small_val, tmp_path, capsys):
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return None\n")
    out = tmp_path / "out"
    code = main([*SMALL, f"data.val_files={small_val}", f"reward.custom_fn.path={reward}", "trainer.total_steps=3",
                 f"trainer.output_dir={out}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith("rlplat: step 1: 8 of 8 reward calls failed (reward.fail_fraction_to_stop=1)")
    assert "reward function 'compute_score' on sample 0" in err[-1] and "returned None" in err[-1]
    assert not any("Traceback" in line for line in err)
    assert not (out / "checkpoints").exists()  # nothing was trained, nothing saved
    initial = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert initial["step"] == 0 and initial["val/reward_num_errors"] == 32  # validation errors are counted
