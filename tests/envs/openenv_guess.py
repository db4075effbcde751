"""An OpenEnv environment written as OpenEnv's own template writes one, for the tests: the model answers a
sum; a wrong answer is told "no, again:" with a reward of 0, a right one ends the episode with a reward of
1, and the second answer ends it either way. The sum's result comes with each reset (its ``target``)."""

from typing import Any, Optional
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    message: str = Field(..., description="the model's answer")


class GuessObservation(Observation):
    feedback: str = Field(default="", description="what the environment says to the answer")


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self):
        self._state, self.target = State(episode_id=str(uuid4()), step_count=0), ""

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.target = str(kwargs.get("target", ""))
        return GuessObservation(feedback="ready", done=False, reward=0.0)

    def step(self, action: GuessAction) -> GuessObservation:  # type: ignore[override]
        self._state.step_count += 1
        right = action.message.strip() == self.target
        done = right or self._state.step_count >= 2
        return GuessObservation(feedback="right" if right else "no, again:", done=done, reward=float(right))

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=256)
