"""GSM8K: grade-school word problems, answered in a ``\\boxed{}`` and checked with math-verify.

Run: ``python environments/gsm8k/env.py serve --config environments/gsm8k/config.yaml``.
``--env.data_path fixture.jsonl`` uses a local JSONL file of ``{"question", "answer"}`` rows
instead of the hub's ``openai/gsm8k`` (``main``).
"""

import asyncio
import json
import random
import time
from pathlib import Path

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.reward_fns.answers import extract_final_number
from atroposlib.envs.reward_fns.math_rewards import gsm8k_reward
from atroposlib.envs.rollouts import greedy_reply, sample_group
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.group import ScoredData
from atroposlib.type_definitions import Item

HERE = Path(__file__).resolve().parent
SYSTEM_PROMPT = (
    "Solve the math problem step by step, then give the final number as \\boxed{answer}."
)


class GSM8KConfig(BaseEnvConfig):
    data_path: str | None = Field(
        default=None, description="Local JSONL of {question, answer}; None loads openai/gsm8k."
    )
    eval_size: int = Field(default=200, ge=1, description="Test problems used by evaluate().")
    max_completion_tokens: int = Field(default=512, ge=1, description="Tokens per answer.")
    temperature: float = Field(default=1.0, ge=0.0, description="Sampling temperature.")


def load_rows(data_path: str | None, split: str) -> list[dict]:
    """Rows of ``{"question", "answer"}``: from a local JSONL (both splits) or the hub."""
    if data_path is not None:
        path = Path(data_path) if Path(data_path).exists() else HERE / data_path
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    from datasets import load_dataset

    return list(load_dataset("openai/gsm8k", "main", split=split))


class GSM8KEnv(BaseEnv):
    name = "gsm8k"
    env_config_cls = GSM8KConfig

    @classmethod
    def config_init(cls) -> tuple[GSM8KConfig, list[APIServerConfig]]:
        config = GSM8KConfig(
            tokenizer_name="HuggingFaceTB/SmolLM2-135M-Instruct",
            group_size=8,
            max_token_length=1024,
            steps_per_eval=50,
            total_steps=500,
        )
        server = APIServerConfig(
            model_name="default", base_url="http://localhost:9001/v1", server_type="embedded"
        )
        return config, [server]

    async def setup(self) -> None:
        self.train = load_rows(self.config.data_path, "train")
        self.test = load_rows(self.config.data_path, "test")[: self.config.eval_size]
        random.Random(0).shuffle(self.train)
        self.index = 0

    async def get_next_item(self) -> Item:
        row = self.train[self.index % len(self.train)]
        self.index += 1
        return row

    def prompt(self, question: str) -> list[dict]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ]

    async def collect_trajectories(self, item: Item) -> tuple[ScoredData | None, list[Item]]:
        group = await sample_group(
            self.server,
            self.tokenizer,
            self.prompt(item["question"]),
            lambda replies: gsm8k_reward(replies, [item["answer"]] * len(replies)),
            n=self.config.group_size,
            max_tokens=self.config.max_completion_tokens,
            temperature=self.config.temperature,
        )
        return group, []

    async def evaluate(self, *args, **kwargs) -> None:
        started = time.time()
        samples = await asyncio.gather(*(self.evaluate_one(row) for row in self.test))
        accuracy = sum(s["score"] for s in samples) / max(1, len(samples))
        metrics = {"eval/accuracy": accuracy}
        await self.evaluate_log(metrics, samples=samples, start_time=started, end_time=time.time())

    async def evaluate_one(self, row: dict) -> dict:
        """Greedy answer to one test problem (all of them are in flight at once)."""
        prompt = self.prompt(row["question"])
        reply = await greedy_reply(
            self.server, prompt, max_tokens=self.config.max_completion_tokens
        )
        score = gsm8k_reward([reply], [row["answer"]])[0]
        return {"question": row["question"], "response": reply, "score": score,
                "predicted": extract_final_number(reply)}  # fmt: skip


if __name__ == "__main__":
    GSM8KEnv.cli()
