"""An OpenEnv environment written by the tests, served by openenv-core's own HTTP server on loopback:
guess a number from 1 to 9 in at most three tries, told "higher" or "lower" after each (feedback turns);
reward 1 on the right guess. The action has one required field, so a bare reply is a guess.

`python -m support.openenv_env PORT` serves it on 127.0.0.1:PORT (uvicorn, openenv's create_app).
"""

from __future__ import annotations

import random
import sys
from typing import Any, Optional

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

TRIES = 3


class GuessAction(Action):
    guess: str = Field(description="a whole number from 1 to 9")


class GuessObservation(Observation):
    message: str = ""


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id="", step_count=0)
        self.target, self.tries = 5, 0

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        self.target, self.tries = random.Random(seed).randint(1, 9), 0
        self._state = State(episode_id=episode_id or "", step_count=0)
        return GuessObservation(message=f"Guess my number from 1 to 9 ({TRIES} tries). Reply with the number only.")

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self.tries += 1
        self._state.step_count = self.tries
        digits = "".join(ch for ch in action.guess if ch.isdigit())
        guess = int(digits) if digits else None
        if guess == self.target:
            return GuessObservation(message="Right!", done=True, reward=1.0)
        hint = "not a number" if guess is None else "higher" if guess < self.target else "lower"
        return GuessObservation(message=f"{hint}. Guess again.", done=self.tries >= TRIES, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=8)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
