"""An OpenEnv environment written as OpenEnv's own template writes one (docs/environments.md; the tests in
tests/envs run it): the model answers a sum; a wrong answer is told "no, again:" with a reward of 0, a right
one ends the episode with a reward of 1, and the second answer ends it either way. The sum's result comes
with each reset (its ``target``: each row's ``extra_info["openenv"]``). Its rows:

    python examples/environments/openenv_guess.py --num 256 --out data/guess/train.parquet
    python examples/environments/openenv_guess.py --num 64 --seed 1 --out data/guess/val.parquet
"""

import argparse
import random
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


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=4096)


def rows(count: int, seed: int) -> list[dict]:
    """Sums of two digits, each row's answer as the environment's reset argument."""
    rng = random.Random(seed)
    pairs = [(rng.randint(0, 9), rng.randint(0, 9)) for _ in range(count)]
    return [{"data_source": "openenv/guess", "prompt": [{"role": "user", "content": f"{a}+{b}="}],
             "reward_model": {"ground_truth": str(a + b)}, "extra_info": {"index": i, "openenv": {"target": a + b}}}
            for i, (a, b) in enumerate(pairs)]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="write the rows of the guess environment")
    parser.add_argument("--num", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from rlplat.data import write_parquet

    print(f"wrote {args.num} rows to {write_parquet(rows(args.num, args.seed), args.out)}")
