"""Tool calling, single- and multi-turn: the model answers with ``<tool_call>{json}</tool_call>``
blocks; each turn's calls must equal the expected ones exactly (after argument normalisation:
key order, ``2`` vs ``2.0``, surrounding spaces, JSON-string arguments; parallel calls in any
order). The episode score is the mean turn reward (1 match, 0 mismatch, -0.5 malformed JSON).
Later turns see the expected tool results, so one wrong call does not derail the rest. An
episode is one trajectory in token ids: each turn's request continues from exactly the ids of
the turns before (sampled replies, then the template's ids of the tool results and next user
message).
Rows: ``{"tools": [...], "turns": [{"user", "expected_calls", "tool_results"}]}``.
"""

import asyncio
import json
import random
from pathlib import Path

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.hermes import tools_prompt
from atroposlib.envs.reward_fns.tool_call_rewards import tool_call_match_reward
from atroposlib.envs.rollouts import TokenSampler
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.trajectory import Trajectory
from atroposlib.group import ScoredData
from atroposlib.type_definitions import Item

HERE = Path(__file__).resolve().parent


class ToolCallingConfig(BaseEnvConfig):
    data_path: str = Field(default="fixture.jsonl", description="JSONL of tool-calling episodes.")
    max_completion_tokens: int = Field(default=256, ge=1, description="Tokens per turn.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature.")


def load_rows(data_path: str) -> list[dict]:
    path = Path(data_path) if Path(data_path).exists() else HERE / data_path
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def system_prompt(row: dict) -> list[dict]:
    return [{"role": "system", "content": tools_prompt(row["tools"])}]


class ToolCallingEnv(BaseEnv):
    name = "tool_calling"
    env_config_cls = ToolCallingConfig

    @classmethod
    def config_init(cls) -> tuple[ToolCallingConfig, list[APIServerConfig]]:
        config = ToolCallingConfig(
            tokenizer_name="HuggingFaceTB/SmolLM2-135M-Instruct",
            group_size=8,
            max_token_length=2048,
            total_steps=500,
            steps_per_eval=0,
        )
        return config, [
            APIServerConfig(
                model_name="default", base_url="http://localhost:9001/v1", server_type="embedded"
            )
        ]

    async def setup(self) -> None:
        self.rows = load_rows(self.config.data_path)
        random.Random(0).shuffle(self.rows)
        self.index = 0

    async def get_next_item(self) -> Item:
        row = self.rows[self.index % len(self.rows)]
        self.index += 1
        return row

    async def episode(self, sampler: TokenSampler, row: dict) -> tuple[Trajectory, float]:
        """One rollout through every turn; returns the trajectory and its mean turn reward."""
        first = {"role": "user", "content": row["turns"][0]["user"]}
        trajectory = sampler.start([*system_prompt(row), first])
        rewards = []
        for index, turn in enumerate(row["turns"]):
            if index > 0:
                previous = row["turns"][index - 1]["tool_results"]
                results = [
                    {"role": "tool", "content": f"<tool_response>{result}</tool_response>"}
                    for result in previous
                ]
                user = {"role": "user", "content": turn["user"]}
                trajectory = sampler.add_messages(trajectory, [*results, user])
            [trajectory] = await sampler.sample(trajectory)
            rewards.append(tool_call_match_reward([trajectory.reply], [turn["expected_calls"]])[0])
        return trajectory, sum(rewards) / len(rewards)

    async def collect_trajectories(self, item: Item) -> tuple[ScoredData | None, list[Item]]:
        sampler = self.token_sampler()
        if len(item["turns"]) == 1:  # one request with n choices
            return await self.single_turn(sampler, item), []
        episodes = await asyncio.gather(
            *(self.episode(sampler, item) for _ in range(self.config.group_size))
        )
        trajectories, scores = zip(*episodes, strict=True)
        return sampler.group(trajectories, scores), []

    async def single_turn(self, sampler: TokenSampler, row: dict) -> ScoredData:
        turn = row["turns"][0]
        start = sampler.start([*system_prompt(row), {"role": "user", "content": turn["user"]}])
        replies = await sampler.sample(start, n=self.config.group_size)
        expected = [turn["expected_calls"]] * len(replies)
        return sampler.group(replies, tool_call_match_reward([r.reply for r in replies], expected))


if __name__ == "__main__":
    ToolCallingEnv.cli()
