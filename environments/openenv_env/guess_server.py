"""An OpenEnv environment written with openenv-core (example and tests): guess a digit.

``reset(seed)`` draws the secret digit from the seed; each ``step`` takes a guess (the first
digit in ``message``), answers higher/lower, and ends the episode when the guess is right or
after ``MAX_GUESSES``. The reward of a step is 1.0 for the right digit, else 0.1 for a guess
that is a digit at all. Run: ``python environments/openenv_env/guess_server.py --port N``.
"""

from __future__ import annotations

import argparse
import random
import re

import uvicorn
from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app

MAX_GUESSES = 2


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    prompt: str


def step_reward(secret: int, message: str) -> tuple[float, bool, str]:
    """(reward, solved, feedback) of one guess: the scorer the tests compare against."""
    found = re.search(r"\d", message)
    if found is None:
        return 0.0, False, "That is not a digit. Guess a digit from 0 to 9."
    guess = int(found.group())
    if guess == secret:
        return 1.0, True, "Correct!"
    return 0.1, False, "Higher." if guess < secret else "Lower."


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)
        self.secret = 0

    def reset(self, seed: int | None = None, **kwargs: object) -> GuessObservation:
        self.secret = random.Random(seed).randrange(10)
        self._state = State(step_count=0)
        return GuessObservation(prompt="Guess my secret digit (0-9). Reply with one digit.")

    def step(self, action: GuessAction, **kwargs: object) -> GuessObservation:  # type: ignore[override]
        if "crash" in action.message:
            raise RuntimeError("the environment crashed on purpose")
        self._state.step_count += 1
        reward, solved, feedback = step_reward(self.secret, action.message)
        done = solved or self._state.step_count >= MAX_GUESSES
        return GuessObservation(prompt=feedback, reward=reward, done=done)

    @property
    def state(self) -> State:
        return self._state


app = create_fastapi_app(GuessEnvironment, GuessAction, GuessObservation, max_concurrent_envs=64)

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    uvicorn.run(app, host="127.0.0.1", port=parser.parse_args().port, log_level="warning")
