"""The environment interface: the tool environment's steps and limits, and a user environment from a file
(the module docstring's guessing game, run as written)."""

import pytest

import rlplat.agents.environment as environment_module
from rlplat.agents.environment import Environment, Step, ToolEnvironment, load_environment
from rlplat.agents.tools import Calculator

ROW = {"prompt": [{"role": "user", "content": "What is 123456 * 789?"}], "reward_model": {"ground_truth": "97406784"}}


def call(expression):
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


def test_the_tool_environment_runs_calls_until_an_answer():
    env = ToolEnvironment([Calculator()], parser="hermes", max_tool_calls=4)
    assert env.reset(ROW) == ROW["prompt"]
    step = env.step({"role": "assistant", "content": "Let me compute. " + call("123456 * 789")})
    assert step.observations == [{"role": "tool", "name": "calculator", "content": "97406784"}] and not step.done
    step = env.step({"role": "assistant", "content": call("1/0") + '<tool_call>{"name": "search"}</tool_call>'})
    assert [o["content"] for o in step.observations] == [
        "error: division by zero", "error: no tool named 'search'; the tools are ['calculator']"]
    step = env.step({"role": "assistant", "content": "The answer is 97406784."})
    assert step.done and step.observations == []
    assert {k: v for k, v in step.info.items() if k != "tool_seconds"} == \
        {"tool_calls": 3, "tool_errors": 2, "tool_timeouts": 0}


def test_the_tool_call_limit_ends_the_trajectory_and_says_so():
    env = ToolEnvironment([Calculator()], max_tool_calls=2)
    env.reset(ROW)
    step = env.step({"role": "assistant", "content": call("1+1") + call("2+2") + call("3+3")})
    assert step.done and [o["content"] for o in step.observations] == [
        "2", "4", "error: the limit of 2 tool calls is reached"]


def test_the_docstring_example_environment_loads_from_a_file_and_plays(tmp_path):
    source = environment_module.__doc__.split("::\n", 1)[1]
    code = "\n".join(line[4:] for line in source.splitlines() if line.startswith("    ") or not line.strip())
    path = tmp_path / "guess.py"
    path.write_text(code)
    guess_cls = load_environment(f"{path}:Guess")
    env = guess_cls()
    row = {"prompt": [{"role": "user", "content": "Guess my number (1-10)."}], "reward_model": {"ground_truth": "7"}}
    assert env.reset(row) == row["prompt"]
    assert env.step({"role": "assistant", "content": "5"}) == Step([{"role": "user", "content": "higher"}])
    assert env.step({"role": "assistant", "content": "7"}) == Step([], done=True, rewards={"solved": 1.0})


def test_a_file_without_an_environment_class_is_one_clear_error(tmp_path):
    path = tmp_path / "env.py"
    path.write_text("class NotAnEnv:\n    pass\n")
    with pytest.raises(ValueError, match="is not a subclass of rlplat.agents.environment.Environment"):
        load_environment(f"{path}:NotAnEnv")
    with pytest.raises(ValueError, match="defines no 'Missing'"):
        load_environment(f"{path}:Missing")
    assert issubclass(ToolEnvironment, Environment)
