"""Tool calling, single- and multi-turn: the model answers with ``<tool_call>{json}</tool_call>``
blocks; each turn's calls must equal the expected ones exactly (after argument normalisation:
key order, ``2`` vs ``2.0``, surrounding spaces, JSON-string arguments; parallel calls in any
order). The episode score is the mean turn reward (1 match, 0 mismatch, -0.5 malformed JSON).
Later turns see the expected tool results, so one wrong call does not derail the rest.
Rows: ``{"tools": [...], "turns": [{"user", "expected_calls", "tool_results"}]}``.
"""

import asyncio
import json
import random
from pathlib import Path

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.reward_fns.tool_call_rewards import tool_call_match_reward
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.type_definitions import Item
from atroposlib.utils.chat_group import chat_group, sample_group

HERE = Path(__file__).resolve().parent
SYSTEM_PROMPT = (
    "You can call these tools:\n<tools>\n{tools}\n</tools>\n"
    'To call one, reply <tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call> '
    "(one block per call). Answer in plain text when no tool is needed."
)


class ToolCallingConfig(BaseEnvConfig):
    data_path: str = Field(default="fixture.jsonl", description="JSONL of tool-calling episodes.")
    max_completion_tokens: int = Field(default=256, ge=1, description="Tokens per turn.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature.")


def load_rows(data_path: str) -> list[dict]:
    path = Path(data_path) if Path(data_path).exists() else HERE / data_path
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def system_prompt(row: dict) -> list[dict]:
    tools = "\n".join(json.dumps(tool) for tool in row["tools"])
    return [{"role": "system", "content": SYSTEM_PROMPT.format(tools=tools)}]


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
        return config, [APIServerConfig(model_name="default", base_url="http://localhost:9001/v1")]

    async def setup(self) -> None:
        self.rows = load_rows(self.config.data_path)
        random.Random(0).shuffle(self.rows)
        self.index = 0

    async def get_next_item(self) -> Item:
        row = self.rows[self.index % len(self.rows)]
        self.index += 1
        return row

    async def episode(self, row: dict) -> tuple[list[dict], float]:
        """One rollout through every turn; returns the chat and its mean turn reward."""
        chat = system_prompt(row)
        rewards = []
        for turn in row["turns"]:
            chat.append({"role": "user", "content": turn["user"]})
            completion = await self.server.chat_completion(
                messages=chat,
                n=1,
                max_tokens=self.config.max_completion_tokens,
                temperature=self.config.temperature,
            )
            reply = completion.choices[0].message.content or ""
            rewards.append(tool_call_match_reward([reply], [turn["expected_calls"]])[0])
            chat.append({"role": "assistant", "content": reply})
            for result in turn["tool_results"]:
                chat.append({"role": "tool", "content": f"<tool_response>{result}</tool_response>"})
        return chat, sum(rewards) / len(rewards)

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        if len(item["turns"]) == 1:  # one request with n choices
            return await self.single_turn(item), []
        episodes = await asyncio.gather(
            *(self.episode(item) for _ in range(self.config.group_size))
        )
        chats, scores = zip(*episodes, strict=True)
        trim = [c if c[-1]["role"] == "assistant" else self.until_last_reply(c) for c in chats]
        return chat_group(self.tokenizer, trim, scores, train_on_all_assistant_turns=True), []

    @staticmethod
    def until_last_reply(chat: list[dict]) -> list[dict]:
        last = max(i for i, message in enumerate(chat) if message["role"] == "assistant")
        return chat[: last + 1]

    async def single_turn(self, row: dict) -> ScoredDataGroup:
        turn = row["turns"][0]
        expected = turn["expected_calls"]
        return await sample_group(
            self.server,
            self.tokenizer,
            [*system_prompt(row), {"role": "user", "content": turn["user"]}],
            lambda replies: tool_call_match_reward(replies, [expected] * len(replies)),
            n=self.config.group_size,
            max_tokens=self.config.max_completion_tokens,
            temperature=self.config.temperature,
        )


if __name__ == "__main__":
    ToolCallingEnv.cli()
