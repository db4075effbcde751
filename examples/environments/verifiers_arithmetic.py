"""verifiers environments written as their authors write them (verifiers' classic API; docs/environments.md):
``load_environment(kind=...)`` returns a ``SingleTurnEnv``, a ``MultiTurnEnv`` with a stop condition, or a
``ToolEnv`` on the tool-arithmetic task. Nothing here knows rlplat, except that the tool task's problems and
its calculator come from rlplat (the same problems as rlplat's own tool environment's). The tests in
tests/envs run them; the arithmetic suits the embedded model, the tool task the embedded tool model.

    python -m rlplat.data.verifiers --env examples/environments/verifiers_arithmetic.py --out data/vf/train.parquet
"""

import random

import verifiers as vf
from datasets import Dataset


def arithmetic_rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"question": f"{a}+{b}=", "answer": str(a + b)}
            for a, b in ((rng.randint(0, 49), rng.randint(0, 49)) for _ in range(count))]


def last_text(completion) -> str:
    replies = [m for m in completion if m.role == "assistant"]
    return (replies[-1].content or "").strip() if replies else ""


def correct(completion, answer) -> float:
    return 1.0 if last_text(completion) == answer else 0.0


def short(completion) -> float:
    return 1.0 if len(last_text(completion)) <= 2 else 0.0


def group_share(completions, answers) -> list[float]:
    """A group function: the share of the prompt's rollouts that were right, for each of them."""
    right = [last_text(c) == a for c, a in zip(completions, answers)]
    return [sum(right) / len(right)] * len(right)


def broken(completion) -> str:
    return "not a number"


class Again(vf.MultiTurnEnv):
    """A wrong answer is told to try again; the rollout stops when the answer is right (or at max_turns)."""

    async def env_response(self, messages, state, **kwargs):
        return [vf.UserMessage(content="no, again:")]

    @vf.stop
    async def solved(self, state) -> bool:
        trajectory = state["trajectory"]
        return bool(trajectory) and last_text(trajectory[-1]["completion"]) == state["answer"]


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly, e.g. 123456 * 789 or (2 + 3) ** 4 / 7."""
    from rlplat.agents.tools import TOOLS

    return TOOLS.get("calculator")()(expression)


def load_environment(kind: str = "single", count: int = 256, seed: int = 0, broken_rubric: bool = False,
                     split: str = "train"):
    if kind == "single":
        funcs, weights = [correct, short, group_share], [1.0, 0.5, 0.25]
        if broken_rubric:
            funcs, weights = funcs + [broken], weights + [1.0]
        return vf.SingleTurnEnv(dataset=Dataset.from_list(arithmetic_rows(count, seed)),
                                rubric=vf.Rubric(funcs=funcs, weights=weights))
    if kind == "multi":
        return Again(dataset=Dataset.from_list(arithmetic_rows(count, seed)), max_turns=2,
                     rubric=vf.Rubric(funcs=[correct], weights=[1.0]))
    if kind == "tool":
        from rlplat.agents.tools import Calculator
        from rlplat.data.synthetic import tool_arithmetic

        rows = [{"question": row["prompt"][0]["content"], "answer": row["reward_model"]["ground_truth"]}
                for row in tool_arithmetic(count, seed, split=split)]
        env = vf.ToolEnv(tools=[calculator], dataset=Dataset.from_list(rows), max_turns=3,
                         rubric=vf.Rubric(funcs=[correct], weights=[1.0]))
        # the schema the embedded tool model was fine-tuned with (verifiers would derive a longer one)
        env.tool_defs = [vf.Tool(name="calculator", description=Calculator.description,
                                 parameters=Calculator.parameters)]
        return env
    raise ValueError(f"kind must be single, multi or tool, got {kind!r}")
