"""An OpenEnv environment through rlplat's tool loop: its server started from the installed package as a local
process (no container), a session per trajectory, the model's text as the action and the observation as the
next user turn, its step rewards as a reward term; two GRPO steps train on it. A server that does not start
is one line."""

import pytest

pytest.importorskip("openenv", reason="the envs extra: pip install -e '.[envs]'")

from rlplat.agents.openenv_env import OpenEnvFailed  # noqa: E402
from rlplat.data import write_parquet  # noqa: E402
from rlplat.trainer.run import load_run_config, run  # noqa: E402

from examples.environments.openenv_guess import rows as guess_rows  # noqa: E402
from tests.trainer.test_trainer import metrics, overrides  # noqa: E402

SPEC = "rollout.agent.environment=openenv:examples.environments.openenv_guess"


def test_two_grpo_steps_on_an_openenv_environment_started_locally(embedded_cache, tmp_path, monkeypatch):
    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[2])  # the server imports tests.envs...
    train = write_parquet(guess_rows(32, 0), tmp_path / "train.parquet")
    val = write_parquet(guess_rows(8, 1), tmp_path / "val.parquet")
    out = tmp_path / "run"
    cfg, plan = load_run_config(overrides(out, 2, val, f"data.train_files={train}", "trainer.ray_address=inprocess",
                                          "rollout.agent.name=tool", SPEC, "data.max_response_length=8",
                                          "rollout.agent.max_total_tokens=32", "trainer.test_freq=2"))
    run(cfg, plan)
    step = metrics(out)
    for s in (1, 2):
        assert step[s]["reward/num_errors"] == 0
        solved, turns = step[s]["reward/environment/openenv_mean"], step[s]["agent/turns_mean"]
        assert 0.0 < solved < 1.0 and 1.0 < turns <= 2.0  # right answers end at once, wrong ones get a second turn
        assert step[s]["reward/mean"] == pytest.approx(solved)
        assert step[s]["agent/observation_token_frac"] > 0 and step[s]["agent/retokenize_mismatch_frac"] == 0.0
    assert "val/accuracy" in step[2]


def test_a_server_that_does_not_start_is_one_line(embedded_cache, tmp_path):
    data = write_parquet(guess_rows(8, 0), tmp_path / "rows.parquet")
    cfg, plan = load_run_config(overrides(tmp_path / "run", 1, data, f"data.train_files={data}",
                                          "trainer.ray_address=inprocess", "rollout.agent.name=tool",
                                          "rollout.agent.environment=openenv:no_such_module.server.app",
                                          "data.max_response_length=8"))
    with pytest.raises(OpenEnvFailed, match=r"^rollout.agent.environment=openenv:no_such_module.server.app: its server "
                                            r"\(uvicorn no_such_module.server.app:app\) exited with code 1: .*"
                                            r"No module named 'no_such_module'"):
        run(cfg, plan)
