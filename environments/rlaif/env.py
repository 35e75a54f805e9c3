"""RLAIF: two answers to a prompt, an AI judge picks the better one; groups of two.

The judge (the policy itself, on the same inference servers) sees the pair twice, in both
orders, to cancel position bias. Each answer scores +1 when it wins both verdicts, -1 when it
loses both, 0 on a split or unreadable verdict. Every group has two sequences and says so with
``group_overrides={"group_size": 2}``, whatever ``group_size`` the env registered with.
"""

import asyncio
import json
import random
import re
from pathlib import Path

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.group import ScoredData
from atroposlib.type_definitions import Item

HERE = Path(__file__).resolve().parent
JUDGE_PROMPT = (
    "Which response answers the request better (helpful, correct, concise)?\n\n"
    "Request:\n{prompt}\n\nResponse A:\n{a}\n\nResponse B:\n{b}\n\n"
    "Reply with <verdict>A</verdict> or <verdict>B</verdict>."
)
_VERDICT = re.compile(r"<verdict>\s*([AB])\s*</verdict>")


class RLAIFConfig(BaseEnvConfig):
    data_path: str | None = Field(
        default="prompts.jsonl", description="JSONL of {prompt}; None: the hub's UltraFeedback."
    )
    max_completion_tokens: int = Field(default=256, ge=1, description="Tokens per answer.")
    judge_max_tokens: int = Field(default=64, ge=1, description="Tokens per verdict.")


def parse_verdict(reply: str) -> str | None:
    """``"A"`` or ``"B"`` from the last ``<verdict>`` tag, None when unreadable.

    >>> parse_verdict("B is longer. <verdict>A</verdict>"), parse_verdict("A")
    ('A', None)
    """
    found = _VERDICT.findall(reply)
    return found[-1] if found else None


def pair_scores(first_order: str | None, second_order: str | None) -> list[float]:
    """Scores of (answer 1, answer 2) from verdicts on (1 as A, 2 as B) and (2 as A, 1 as B).

    >>> pair_scores("A", "B"), pair_scores("B", "A"), pair_scores("A", "A"), pair_scores(None, "B")
    ([1.0, -1.0], [-1.0, 1.0], [0.0, 0.0], [0.5, -0.5])
    """
    votes_first = (first_order == "A") + (second_order == "B")
    votes_second = (first_order == "B") + (second_order == "A")
    margin = (votes_first - votes_second) / 2
    return [margin + 0.0, 0.0 - margin]


class RLAIFEnv(BaseEnv):
    name = "rlaif"
    env_config_cls = RLAIFConfig

    @classmethod
    def config_init(cls) -> tuple[RLAIFConfig, list[APIServerConfig]]:
        config = RLAIFConfig(
            tokenizer_name="HuggingFaceTB/SmolLM2-135M-Instruct",
            group_size=2,
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
        if self.config.data_path is None:
            from datasets import load_dataset

            rows = load_dataset("HuggingFaceH4/ultrafeedback_binarized", split="train_prefs")
            self.prompts = [row["prompt"] for row in rows]
        else:
            path = Path(self.config.data_path)
            path = path if path.exists() else HERE / path
            self.prompts = [json.loads(x)["prompt"] for x in path.read_text().splitlines() if x]
        random.Random(0).shuffle(self.prompts)
        self.index = 0

    async def get_next_item(self) -> Item:
        prompt = self.prompts[self.index % len(self.prompts)]
        self.index += 1
        return {"prompt": prompt}

    async def judge(self, prompt: str, a: str, b: str) -> str | None:
        content = JUDGE_PROMPT.format(prompt=prompt, a=a, b=b)
        completion = await self.server.chat_completion(
            messages=[{"role": "user", "content": content}],
            n=1, temperature=0.0, max_tokens=self.config.judge_max_tokens,
        )  # fmt: skip
        return parse_verdict(completion.choices[0].message.content or "")

    async def collect_trajectories(self, item: Item) -> tuple[ScoredData | None, list[Item]]:
        sampler = self.token_sampler()
        start = sampler.start([{"role": "user", "content": item["prompt"]}])
        answers = await sampler.sample(start, n=2)
        first, second = (answer.reply for answer in answers)
        verdicts = await asyncio.gather(
            self.judge(item["prompt"], first, second), self.judge(item["prompt"], second, first)
        )
        group = sampler.group(answers, pair_scores(*verdicts), group_overrides={"group_size": 2})
        return group, []


if __name__ == "__main__":
    RLAIFEnv.cli()
