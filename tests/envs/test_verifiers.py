"""verifiers environments (its classic API: SingleTurnEnv, MultiTurnEnv with a stop condition, ToolEnv) through
rlplat's tool loop: the trained ids are the sampled ids and the observations between them, token for token
(observations attended, not trained); the reward terms are the rubric's functions on the same completions,
group functions on the prompt's group; two GRPO steps train on each; failures are one line."""

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("verifiers", reason="the envs extra: pip install -e '.[envs]'")

from rlplat.config import ConfigError  # noqa: E402
from rlplat.data import write_parquet  # noqa: E402
from rlplat.data.verifiers import main as verifiers_cli, rows as environment_rows  # noqa: E402
from rlplat.models.embedded import EMBEDDED_TOOLS, embedded_model_dir  # noqa: E402
from rlplat.protocol import Batch  # noqa: E402
from rlplat.rollout.agent_loop import ToolLoop  # noqa: E402
from rlplat.rollout.base import SamplingParams  # noqa: E402
from rlplat.trainer.run import load_run_config, run  # noqa: E402
from rlplat.trainer.sft import ensure_embedded_model  # noqa: E402

from tests.rollout.test_agent_loop import agent_setup  # noqa: E402
from tests.trainer.test_trainer import metrics, overrides  # noqa: E402
from tests.workers.helpers import check_trajectories  # noqa: E402

# the environments are an example of their own (a user's file, loaded by path)
ENVS = str(Path(__file__).resolve().parents[2] / "examples" / "environments" / "verifiers_arithmetic.py")
SPEC = f"rollout.agent.environment=verifiers:{ENVS}"
MODELS = {"single": None, "multi": None, "tool": EMBEDDED_TOOLS}  # the tool task needs the tool model
LIMITS = {"single": ("data.max_response_length=8",), "multi": ("data.max_response_length=8",),
          "tool": ("data.max_response_length=88", "rollout.agent.max_total_tokens=128")}


def prompts_of(tokenizer, rows, n, schemas):
    """The rows as the trainer hands them to the loop: each ``n`` times (one prompt group, one uid)."""
    rows = [row for row in rows for _ in range(n)]
    ids = [list(tokenizer.apply_chat_template(row["prompt"], tools=schemas, add_generation_prompt=True,
                                              tokenize=True, return_dict=True)["input_ids"]) for row in rows]
    width = max(map(len, ids))
    return Batch.from_dict(
        {"prompts": torch.tensor([[tokenizer.pad_token_id] * (width - len(i)) + i for i in ids]),
         "prompt_mask": torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])},
        {"raw_prompt": [row["prompt"] for row in rows], "data_source": [row["data_source"] for row in rows],
         "ground_truth": [row["reward_model"]["ground_truth"] for row in rows],
         "extra_info": [row["extra_info"] for row in rows], "uid": [f"g{k // n}" for k in range(len(rows))]})


def expected_terms(kind, messages, answer, group):
    """The rubric's functions (examples/environments/verifiers_arithmetic.py) on the conversation, weighted as the
    rubric weighs them."""
    last = next(m["content"].strip() for m in reversed(messages) if m["role"] == "assistant")
    terms = {"correct": float(last == answer)}
    if kind == "single":
        terms["short"] = 0.5 * float(len(last) <= 2)
        terms["group_share"] = 0.25 * group
    return terms


@pytest.mark.parametrize("kind", ["single", "multi", "tool"])
def test_the_loop_trains_the_sampled_ids_and_scores_with_the_rubric(kind, embedded_cache, tmp_path):
    model = str(ensure_embedded_model(MODELS[kind]) if MODELS[kind] else embedded_model_dir())
    cfg, tokenizer, engine = agent_setup(model, tmp_path, SPEC, f"rollout.agent.environment_args={{kind: {kind}}}")
    loop = ToolLoop(cfg.rollout.agent, tokenizer, response_length=128 if kind == "tool" else 24)
    rows = environment_rows(ENVS, {"kind": kind, "count": 8})
    schemas = loop.environments.schemas_of(None)
    assert (schemas is not None) == (kind == "tool")
    prompts = prompts_of(tokenizer, rows, 4, schemas)
    torch.manual_seed(0)
    out = loop.run(engine, prompts, SamplingParams(max_new_tokens=88 if kind == "tool" else 8, temperature=1.0))
    multi_turn = check_trajectories(out, tokenizer, {tokenizer.eos_token_id})  # token-exact, observations untrained
    agents = [info["agent"] for info in out.non_tensors["extra_info"]]
    assert all(agent["retokenize_mismatch_frac"] == 0.0 for agent in agents)
    if kind == "single":
        assert multi_turn == 0 and all(agent["turns"] == 1 for agent in agents)
    else:  # wrong answers were told to try again / tools were called, and their results read
        assert multi_turn > 0 and any(agent["observation_tokens"] > 0 for agent in agents)
    if kind == "tool":
        assert sum(agent["tool_calls"] for agent in agents) > 0
    for g in range(len(rows)):
        group = agents[4 * g:4 * g + 4]
        answer = rows[g]["reward_model"]["ground_truth"]
        right = [next(m["content"].strip() for m in reversed(a["messages"]) if m["role"] == "assistant") == answer
                 for a in group]
        for agent in group:
            expected = expected_terms(kind, agent["messages"], answer, sum(right) / 4)
            assert agent["rewards"] == pytest.approx(expected)
            assert agent["verifiers_reward"] == pytest.approx(sum(expected.values()))  # the rubric's own total
    assert 0 < sum(agent["rewards"]["correct"] for agent in agents) < len(agents)


@pytest.mark.parametrize("kind", ["single", "multi", "tool"])
def test_two_grpo_steps_on_a_verifiers_environment(kind, embedded_cache, tmp_path):
    data = tmp_path / "rows.parquet"
    env_args = json.dumps({"kind": kind, "count": 16})
    assert verifiers_cli(["--env", ENVS, "--env-args", env_args, "--out", str(data)]) == 0
    out = tmp_path / "run"
    model = [f"model.path={MODELS[kind]}"] if MODELS[kind] else []
    cfg, plan = load_run_config(overrides(out, 2, data, f"data.train_files={data}", "trainer.ray_address=inprocess",
                                          "rollout.agent.name=tool", SPEC,
                                          f"rollout.agent.environment_args.kind={kind}", *model, *LIMITS[kind]))
    run(cfg, plan)
    step = metrics(out)
    for s in (1, 2):
        assert step[s]["reward/num_errors"] == 0 and "reward/environment/correct_mean" in step[s]
        assert step[s]["reward/mean"] == pytest.approx(sum(v for k, v in step[s].items()
                                                           if k.startswith("reward/environment/")))
        assert step[s]["agent/retokenize_mismatch_frac"] == 0.0
        assert (step[s]["agent/observation_token_frac"] > 0) == (kind != "single")


def test_a_rubric_that_returns_a_non_number_stops_the_run_naming_it(embedded_cache, tmp_path):
    from rlplat.agents.verifiers_env import VerifiersFailed

    data = write_parquet(environment_rows(ENVS, {"count": 8}), tmp_path / "rows.parquet")
    cfg, plan = load_run_config(overrides(tmp_path / "run", 1, data, f"data.train_files={data}",
                                          "trainer.ray_address=inprocess", "rollout.agent.name=tool", SPEC,
                                          "rollout.agent.environment_args.broken_rubric=true",
                                          "data.max_response_length=8"))
    message = (r"verifiers environment '.*verifiers_arithmetic.py': its rubric function broken returned 'not a number' "
               r"\(str\), not a number on row \d+ \(group of \d\); rlplat does not train on a reward")
    with pytest.raises(VerifiersFailed, match=message):
        run(cfg, plan)


@pytest.mark.parametrize("spec, args, message", [
    ("verifiers:no_such_env_module", {}, r"rollout.agent.environment=verifiers:no_such_env_module: no installed "
                                         r"environment or module 'no_such_env_module' \(install it"),
    (f"verifiers:{ENVS}", {"kind": "chess"}, r"load_environment raised ValueError: kind must be single, multi or tool"),
    ("verifiers:/nowhere/env.py", {}, r"rollout.agent.environment=verifiers:/nowhere/env.py: no such file"),
])
def test_an_environment_that_does_not_load_is_one_line_at_start_up(spec, args, message):
    arguments = [f"rollout.agent.environment_args.{k}={v}" for k, v in args.items()]
    with pytest.raises(ConfigError, match=message):
        load_run_config(["rollout.agent.name=tool", f"rollout.agent.environment={spec}", *arguments])


def test_rows_of_an_environment_without_it_are_refused_not_scored_zero(embedded_cache, tmp_path):
    from rlplat.reward import UnknownDataSourceError

    data = write_parquet(environment_rows(ENVS, {"count": 8}), tmp_path / "rows.parquet")
    cfg, plan = load_run_config(overrides(tmp_path / "run", 1, data, f"data.train_files={data}",
                                          "trainer.ray_address=inprocess", "data.max_response_length=8"))
    with pytest.raises(UnknownDataSourceError, match=r"these rows are scored by their verifiers environment, which "
                                                     r"did not run on them; set rollout.agent.name=tool"):
        run(cfg, plan)


@pytest.mark.parametrize("library, spec, target", [
    ("verifiers", "verifiers:my-env", "rlplat.agents.verifiers_env:VerifiersEnvironments"),
    ("openenv", "openenv:my_env.server.app", "rlplat.agents.openenv_env:OpenEnvEnvironments"),
])
def test_a_library_that_is_not_installed_is_one_line_naming_the_extra(library, spec, target, monkeypatch):
    import sys

    from rlplat.agents.setup import ENVIRONMENT_SOURCES

    monkeypatch.setattr(ENVIRONMENT_SOURCES, "_entries", dict(ENVIRONMENT_SOURCES._entries))  # as it was, after
    ENVIRONMENT_SOURCES.add_lazy(library, target, requires=(library,), install="pip install -e '.[envs]'", replace=True)
    monkeypatch.setitem(sys.modules, library, None)  # as if it were not installed
    with pytest.raises(ConfigError, match=rf"^rollout.agent.environment='{spec}': environment library '{library}' "
                                          rf"needs the package '{library}', which is not installed; install it with: "
                                          r"pip install -e '\.\[envs\]'$"):
        load_run_config(["rollout.agent.name=tool", f"rollout.agent.environment={spec}"])
