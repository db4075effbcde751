"""The client loop: a harness holds each row's conversation through an OpenAI client on rlplat's endpoint, and
the trainer trains on it token for token; its trajectories are the tool loop's for the same protocol (greedy),
verifiers' own rollout loop trains this way, and a bad harness is one line."""

from pathlib import Path

import pytest
import torch

pytest.importorskip("openai", reason="the envs extra: pip install -e '.[envs]'")
pytest.importorskip("verifiers", reason="the envs extra: pip install -e '.[envs]'")

from rlplat.config import ConfigError  # noqa: E402
from rlplat.data.verifiers import main as verifiers_cli, rows as environment_rows  # noqa: E402
from rlplat.models.embedded import embedded_model_dir  # noqa: E402
from rlplat.rollout.agent_loop import AGENT_LOOPS, EnvironmentFailed  # noqa: E402
from rlplat.rollout.base import SamplingParams  # noqa: E402
from rlplat.trainer.run import load_run_config, run  # noqa: E402

from tests.envs.test_verifiers import ENVS, SPEC, prompts_of  # noqa: E402
from tests.rollout.test_agent_loop import agent_setup  # noqa: E402
from tests.trainer.test_trainer import metrics, overrides  # noqa: E402

HARNESSES = Path(ENVS).parent / "harnesses.py"


def test_the_harness_conversations_are_the_tool_loops_trajectories(embedded_cache, tmp_path):
    rows = environment_rows(ENVS, {"kind": "multi", "count": 8})
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    tool_cfg, tokenizer, engine = agent_setup(str(embedded_model_dir()), tmp_path, SPEC,
                                              "rollout.agent.environment_args={kind: multi}")
    expected = AGENT_LOOPS.get("tool")(tool_cfg.rollout.agent, tokenizer, 24).run(engine, prompts_of(tokenizer, rows, 2, None),
                                                                                 params)
    client_cfg = load_run_config(["rollout.agent.name=client", f"rollout.agent.harness={HARNESSES}:again"])[0]
    out = AGENT_LOOPS.get("client")(client_cfg.rollout.agent, tokenizer, 24).run(engine, prompts_of(tokenizer, rows, 2, None),
                                                                                 params)
    for key in ("responses", "response_mask", "attention_mask", "input_ids"):
        assert torch.equal(out.tensors[key], expected.tensors[key]), key
    torch.testing.assert_close(out.tensors["rollout_log_probs"], expected.tensors["rollout_log_probs"])
    ours = [info["agent"] for info in out.non_tensors["extra_info"]]
    theirs = [info["agent"] for info in expected.non_tensors["extra_info"]]
    assert [a["rewards"] for a in ours] == [t["rewards"] for t in theirs]  # the harness's check = the rubric's
    assert any(a["observation_tokens"] > 0 for a in ours) and all(a["retokenize_mismatch_frac"] == 0 for a in ours)


def test_two_grpo_steps_with_verifiers_own_rollout_loop_as_the_harness(embedded_cache, tmp_path):
    data = tmp_path / "rows.parquet"
    assert verifiers_cli(["--env", ENVS, "--env-args", '{"kind": "multi", "count": 16}', "--out", str(data)]) == 0
    out = tmp_path / "run"
    cfg, plan = load_run_config(overrides(out, 2, data, f"data.train_files={data}", "trainer.ray_address=inprocess",
                                          "rollout.agent.name=client",
                                          f"rollout.agent.harness={HARNESSES}:verifiers_rollout",
                                          "data.max_response_length=8", "rollout.agent.max_total_tokens=24"))
    run(cfg, plan)
    step = metrics(out)
    for s in (1, 2):
        assert step[s]["reward/num_errors"] == 0 and 0 < step[s]["agent/turns_mean"] <= 2
        assert step[s]["reward/mean"] == pytest.approx(step[s]["reward/environment/correct_mean"])
        assert step[s]["agent/observation_token_frac"] > 0


def test_a_bad_harness_is_one_line(embedded_cache, tmp_path):
    (tmp_path / "h.py").write_text("def sync(client, row):\n    return {}\n\n"
                                   "async def broken(client, row):\n    raise KeyError('answer')\n")
    with pytest.raises(ConfigError, match=r"needs rollout.agent.harness: an async function"):
        load_run_config(["rollout.agent.name=client"])
    with pytest.raises(ConfigError, match=r"rollout.agent.harness '.*h.py:sync' is not an async function"):
        load_run_config(["rollout.agent.name=client", f"rollout.agent.harness={tmp_path}/h.py:sync"])
    rows = environment_rows(ENVS, {"kind": "multi", "count": 2})
    cfg, tokenizer, engine = agent_setup(str(embedded_model_dir()), tmp_path, "rollout.agent.name=client",
                                         f"rollout.agent.harness={tmp_path}/h.py:broken")
    with pytest.raises(EnvironmentFailed, match=r"rollout.agent.harness '.*h.py:broken' raised on row 0 "
                                                r"\(verifiers/verifiers_arithmetic\): KeyError: 'answer'"):
        AGENT_LOOPS.get("client")(cfg.rollout.agent, tokenizer, 24).run(engine, prompts_of(tokenizer, rows, 1, None),
                                                                       SamplingParams(max_new_tokens=8))
