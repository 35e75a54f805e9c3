"""Atropos-style env: rewards from the registry (dataset_env's way of scoring)."""

from typing import List, Optional, Tuple

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.reward_fns import registry
from atroposlib.envs.reward_fns.combined_reward import CombinedReward
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

QUESTIONS = [("What is 2+3? Answer in \\boxed{}.", "5"), ("What is 4+4? Answer in \\boxed{}.", "8")]


class RewardRegistryEnv(BaseEnv):
    name = "reward_registry"

    @classmethod
    def config_init(cls) -> Tuple[BaseEnvConfig, List[APIServerConfig]]:
        return BaseEnvConfig(group_size=2, use_wandb=False), [APIServerConfig()]

    async def setup(self):
        self.iter = 0
        self.reward_fn = CombinedReward(
            rewards=[
                "accuracy_reward",
                {"type": "format", "params": {"preferred_tags": ["think"]}},
            ],
            normalization="none",
        )
        self.steps = registry.create("reasoning_steps", weight=0.5)

    async def get_next_item(self) -> Optional[Item]:
        question = QUESTIONS[self.iter % len(QUESTIONS)]
        self.iter += 1
        return question

    async def collect_trajectories(self, item: Item) -> Tuple[ScoredDataGroup, List[Item]]:
        question, answer = item
        chat = [{"role": "user", "content": question}]
        completion = await self.server.chat_completion(
            messages=chat, n=self.config.group_size, max_tokens=24, temperature=1.0
        )
        replies = [choice.message.content for choice in completion.choices]
        scores = self.reward_fn(replies, solution=answer)
        steps = self.steps(replies)
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        for reply, score, step in zip(replies, scores, steps):
            out = tokenize_for_trainer(
                self.tokenizer,
                chat + [{"role": "assistant", "content": reply}],
                include_messages=True,
            )
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["messages"].append(out["messages"])
            group["scores"].append(score + step)
        return group, []


if __name__ == "__main__":
    RewardRegistryEnv.cli()
