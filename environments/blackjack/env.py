"""Blackjack (gymnasium ``Blackjack-v1``): multi-step, one message per step, episode reward.

Each step shows the player's sum, the dealer's card and whether an ace is usable; the model
answers ``<action>hit</action>`` or ``<action>stick</action>``. The episode's reward is the
game's (+1 win, 0 push, -1 loss, +1.5 natural blackjack when ``natural``); an unreadable
action forfeits the hand (``invalid_action_reward``). All ``group_size`` episodes of a group
start from the same seed, so they see the same first cards. Each episode is one trajectory in
token ids: every step's request continues from exactly the ids of the steps before.
"""

import asyncio
import random
import re

import gymnasium as gym
from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.rollouts import TokenSampler
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.trajectory import Trajectory
from atroposlib.group import ScoredData
from atroposlib.type_definitions import Item

RULES = (
    "You play blackjack against the dealer. Each turn, reply <action>hit</action> to take a "
    "card or <action>stick</action> to stop. Going over 21 loses."
)
_ACTION = re.compile(r"<action>\s*(hit|stick)\s*</action>", re.IGNORECASE)


class BlackjackConfig(BaseEnvConfig):
    natural: bool = Field(default=True, description="A natural blackjack pays 1.5.")
    invalid_action_reward: float = Field(default=-1.0, description="Reward for a bad reply.")
    max_completion_tokens: int = Field(default=48, ge=1, description="Tokens per step.")
    seed: int = Field(default=0, description="Seed of the episode seeds.")


def parse_action(reply: str) -> int | None:
    """1 for hit, 0 for stick (the last ``<action>`` tag), None when there is none.

    >>> [parse_action(r) for r in ("<action>hit</action>", "<action> Stick </action>", "hit")]
    [1, 0, None]
    """
    found = _ACTION.findall(reply)
    return None if not found else int(found[-1].lower() == "hit")


def describe(observation: tuple[int, int, int]) -> str:
    player, dealer, usable_ace = observation
    ace = " You hold an ace counted as 11." if usable_ace else ""
    return f"Your hand totals {player}. The dealer shows {dealer}.{ace} Hit or stick?"


class BlackjackEnv(BaseEnv):
    name = "blackjack"
    env_config_cls = BlackjackConfig

    @classmethod
    def config_init(cls) -> tuple[BlackjackConfig, list[APIServerConfig]]:
        config = BlackjackConfig(
            tokenizer_name="HuggingFaceTB/SmolLM2-135M-Instruct",
            group_size=8,
            max_token_length=1024,
            total_steps=500,
            steps_per_eval=0,
        )
        return config, [
            APIServerConfig(
                model_name="default", base_url="http://localhost:9001/v1", server_type="embedded"
            )
        ]

    async def setup(self) -> None:
        self.rng = random.Random(self.config.seed)

    async def get_next_item(self) -> Item:
        return {"seed": self.rng.randrange(2**31)}

    async def episode(self, sampler: TokenSampler, seed: int) -> tuple[Trajectory, float]:
        game = gym.make("Blackjack-v1", natural=self.config.natural)
        observation, _ = game.reset(seed=seed)
        trajectory = sampler.start(
            [
                {"role": "system", "content": RULES},
                {"role": "user", "content": describe(observation)},
            ]
        )
        reward = 0.0
        while True:
            [trajectory] = await sampler.sample(trajectory)
            action = parse_action(trajectory.reply)
            if action is None:
                return trajectory, self.config.invalid_action_reward
            observation, step_reward, terminated, truncated, _ = game.step(action)
            reward = float(step_reward)
            if terminated or truncated:
                game.close()
                return trajectory, reward
            step = {"role": "user", "content": describe(observation)}
            trajectory = sampler.add_messages(trajectory, [step])

    async def collect_trajectories(self, item: Item) -> tuple[ScoredData | None, list[Item]]:
        sampler = self.token_sampler()
        runs = [self.episode(sampler, item["seed"]) for _ in range(self.config.group_size)]
        trajectories, rewards = zip(*await asyncio.gather(*runs), strict=True)
        return sampler.group(trajectories, rewards), []


if __name__ == "__main__":
    BlackjackEnv.cli()
