"""What an agent talks to: one small interface for environments, simulated users and tools.

An :class:`Environment` is made for one trajectory (one dataset row). ``reset(row)`` returns the
conversation's first messages (usually the row's prompt); after each assistant turn, ``step(message)``
returns the :class:`Step`: the observation messages to append (tool results, a user's reply), whether the
trajectory is over, and reward terms that add to the reward manager's scores. A TRL-style environment,
a verl-style interaction (a simulated user that replies) and tool use are all this shape;
:class:`ToolEnvironment` is the tool case.

Write your own in a file and name it as ``path/to/file.py:ClassName``, or in an importable module as
``package.module:ClassName`` (:func:`load_environment`)::

    # guess.py: the model guesses a number; the environment says higher / lower, two turns at most
    from rlplat.agents.environment import Environment, Step

    class Guess(Environment):
        def reset(self, row):
            self.target, self.turns = int(row["reward_model"]["ground_truth"]), 0
            return list(row["prompt"])

        def step(self, message):
            self.turns += 1
            guess = int("".join(c for c in message["content"] if c.isdigit()) or -1)
            if guess == self.target or self.turns == 2:
                return Step([], done=True, rewards={"solved": float(guess == self.target)})
            hint = "higher" if guess < self.target else "lower"
            return Step([{"role": "user", "content": hint}])
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlplat.agents.parsers import TOOL_PARSERS
from rlplat.agents.tools import Tool, ToolResult, call_tool, load_object


@dataclass
class Step:
    observations: list[dict]  # messages to append before the next assistant turn (none when done)
    done: bool = False
    rewards: dict[str, float] = field(default_factory=dict)  # reward terms, added to the reward manager's
    info: dict[str, Any] = field(default_factory=dict)  # what the loop logs and passes to the reward (extra_info)


class Environment(ABC):
    """One trajectory's environment (see the module doc)."""

    tools: Sequence[Tool] = ()  # their schemas go to the chat template (tools=)

    @abstractmethod
    def reset(self, row: Mapping[str, Any]) -> list[dict]:
        """The first messages of the conversation for this dataset row."""

    @abstractmethod
    def step(self, message: dict) -> Step:
        """React to the assistant's message (``{"role": "assistant", "content": ...}``)."""


class ToolEnvironment(Environment):
    """Tool use: each assistant message's tool calls (read by the ``parser``) are run, and their results
    are the observation, one ``tool`` message per call; a message without calls, or ``max_tool_calls`` in
    all, ends the trajectory. Failed calls are error observations (:func:`~rlplat.agents.tools.call_tool`);
    ``info`` counts calls, errors, timeouts and tool seconds."""

    def __init__(self, tools: Sequence[Tool], parser: str = "hermes", max_tool_calls: int = 8):
        self.tools, self.parse = list(tools), TOOL_PARSERS.get(parser)
        self.by_name = {tool.name: tool for tool in self.tools}
        self.max_tool_calls = max_tool_calls
        self.results: list[ToolResult] = []

    def reset(self, row: Mapping[str, Any]) -> list[dict]:
        self.results = []
        return [dict(m) for m in row["prompt"]]

    def step(self, message: dict) -> Step:
        calls = self.parse(message.get("content", "")).calls
        if not calls:
            return Step([], done=True, info=self._info())
        room = self.max_tool_calls - len(self.results)
        observations = []
        for call in calls[:max(room, 0)]:
            result = call_tool(call, self.by_name)
            self.results.append(result)
            observations.append({"role": "tool", "name": call.name or "unknown", "content": result.observation})
        done = len(self.results) >= self.max_tool_calls
        if done and len(calls) > room:
            observations.append({"role": "tool", "name": "limit",
                                 "content": f"error: the limit of {self.max_tool_calls} tool calls is reached"})
        return Step(observations, done=done, info=self._info())

    def _info(self) -> dict[str, Any]:
        statuses = [r.status for r in self.results]
        return {"tool_calls": len(statuses), "tool_errors": statuses.count("error"),
                "tool_timeouts": statuses.count("timeout"), "tool_seconds": sum(r.seconds for r in self.results)}


def load_environment(spec: str) -> type[Environment]:
    """The :class:`Environment` subclass named ``"path/to/file.py:ClassName"`` or
    ``"package.module:ClassName"``; a ``ValueError`` naming the spec and what is wrong otherwise."""
    cls = load_object(spec, "environment")
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ValueError(f"environment {spec!r}: {cls!r} is not a subclass of rlplat.agents.environment.Environment")
    return cls
