"""The smallest useful environment, written exactly as an Atropos 0.4 user writes one.

Asks "What is a+b?" with answers below group_size, scores 1.0 when the reply holds the answer.
Run: ``python example_env.py serve --openai.base_url http://localhost:9001/v1``.
"""

# Written in Atropos 0.4 style on purpose (typing.List, concatenation): the user's view.
# ruff: noqa: RUF005

import os
import random

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


class AdditionEnv(BaseEnv):
    name = "addition"

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, list[APIServerConfig]]:
        env_config = BaseEnvConfig(
            tokenizer_name=os.environ.get(
                "EXAMPLE_TOKENIZER", "HuggingFaceTB/SmolLM2-135M-Instruct"
            ),
            group_size=4,
            use_wandb=False,
            max_token_length=256,
            total_steps=5,
            batch_size=-1,
            steps_per_eval=2,
        )
        server_configs = [
            APIServerConfig(model_name="fake", base_url="http://localhost:9001/v1", api_key="x")
        ]
        return env_config, server_configs

    async def setup(self):
        self.rng = random.Random(0)
        self.evaluated = 0

    async def get_next_item(self) -> Item:
        a = self.rng.randrange(self.config.group_size)
        return {"question": f"What is {a}+0?", "answer": str(a)}

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        chat = [{"role": "user", "content": item["question"]}]
        completion = await self.server.chat_completion(
            messages=chat, n=self.config.group_size, max_tokens=32
        )
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        for choice in completion.choices:
            messages = chat + [{"role": "assistant", "content": choice.message.content}]
            out = tokenize_for_trainer(self.tokenizer, messages, include_messages=True)
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["messages"].append(out["messages"])
            group["scores"].append(1.0 if item["answer"] in choice.message.content else 0.0)
        return group, []

    async def evaluate(self, *args, **kwargs):
        self.evaluated += 1
        completion = await self.server.chat_completion(
            messages=[{"role": "user", "content": "What is 1+0?"}], n=1, split="eval"
        )
        correct = float("1" in completion.choices[0].message.content)
        await self.evaluate_log(
            metrics={"eval/accuracy": correct},
            samples=[
                {"question": "What is 1+0?", "response": completion.choices[0].message.content}
            ],
        )


if __name__ == "__main__":
    AdditionEnv.cli()
