"""MATH-style problems: the final ``\\boxed{}`` answer is checked with math-verify, so
equivalent forms count (``\\frac{1}{2}`` = ``0.5`` = ``\\dfrac12``; units like ``\\text{ cm}``
are stripped). Train on ``train_dataset``, evaluate on ``eval_dataset`` (MATH-500 by default);
``data_path`` uses one local JSONL of ``{problem, answer, split}`` for both.
"""

import asyncio
import json
import random
import time
from pathlib import Path

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.reward_fns.answers import extract_boxed
from atroposlib.envs.reward_fns.math_rewards import boxed_math_reward
from atroposlib.envs.rollouts import greedy_reply, sample_group
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.group import ScoredData
from atroposlib.type_definitions import Item

HERE = Path(__file__).resolve().parent
SYSTEM_PROMPT = "Solve the problem. Put the final answer in \\boxed{}."


class MathConfig(BaseEnvConfig):
    data_path: str | None = Field(default=None, description="Local JSONL {problem, answer, split}.")
    train_dataset: str = Field(
        default="DigitalLearningGmbH/MATH-lighteval", description="Hub dataset for training."
    )
    eval_dataset: str = Field(default="HuggingFaceH4/MATH-500", description="Hub eval dataset.")
    eval_size: int = Field(default=500, ge=1, description="Eval problems used by evaluate().")
    max_completion_tokens: int = Field(default=1024, ge=1, description="Tokens per answer.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature.")


def answer_of(row: dict) -> str:
    """The reference answer: an ``answer`` field, else the solution's last box."""
    return row.get("answer") or extract_boxed(row.get("solution", "")) or ""


def load_split(config: MathConfig, split: str) -> list[dict]:
    if config.data_path is not None:
        path = (
            Path(config.data_path) if Path(config.data_path).exists() else HERE / config.data_path
        )
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [row for row in rows if row.get("split", "train") == split]
    from datasets import load_dataset

    name = config.train_dataset if split == "train" else config.eval_dataset
    return list(load_dataset(name, split="train" if split == "train" else "test"))


class MathEnv(BaseEnv):
    name = "math"
    env_config_cls = MathConfig

    @classmethod
    def config_init(cls) -> tuple[MathConfig, list[APIServerConfig]]:
        config = MathConfig(
            tokenizer_name="HuggingFaceTB/SmolLM2-135M-Instruct",
            group_size=8,
            max_token_length=2048,
            total_steps=1000,
            steps_per_eval=100,
        )
        return config, [
            APIServerConfig(
                model_name="default", base_url="http://localhost:9001/v1", server_type="embedded"
            )
        ]

    async def setup(self) -> None:
        self.train = load_split(self.config, "train")
        self.test = load_split(self.config, "test")[: self.config.eval_size]
        random.Random(0).shuffle(self.train)
        self.index = 0

    async def get_next_item(self) -> Item:
        row = self.train[self.index % len(self.train)]
        self.index += 1
        return {"problem": row["problem"], "answer": answer_of(row)}

    def prompt(self, problem: str) -> list[dict]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": problem}]

    async def collect_trajectories(self, item: Item) -> tuple[ScoredData | None, list[Item]]:
        group = await sample_group(
            self.server,
            self.tokenizer,
            self.prompt(item["problem"]),
            lambda replies: boxed_math_reward(replies, [item["answer"]] * len(replies)),
            n=self.config.group_size,
            max_tokens=self.config.max_completion_tokens,
            temperature=self.config.temperature,
        )
        return group, []

    async def evaluate(self, *args, **kwargs) -> None:
        started = time.time()
        samples = await asyncio.gather(*(self.evaluate_one(row) for row in self.test))
        metrics = {"eval/accuracy": sum(s["score"] for s in samples) / max(1, len(samples))}
        await self.evaluate_log(metrics, samples=samples, start_time=started, end_time=time.time())

    async def evaluate_one(self, row: dict) -> dict:
        """Greedy answer to one test problem (all of them are in flight at once)."""
        prompt = self.prompt(row["problem"])
        reply = await greedy_reply(
            self.server, prompt, max_tokens=self.config.max_completion_tokens
        )
        score = boxed_math_reward([reply], [answer_of(row)])[0]
        return {"problem": row["problem"], "answer": answer_of(row), "response": reply,
                "score": score}  # fmt: skip


if __name__ == "__main__":
    MathEnv.cli()
