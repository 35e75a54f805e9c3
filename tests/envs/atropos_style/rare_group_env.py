"""Atropos-style env that rarely forms a group, as a small model on a hard task does: every
rollout asks the server, and only rollout ``--env.group_on_rollout`` (-1: none) gives a group
with different scores; the others are all-equal groups, returned as ``None``."""

from typing import List, Optional, Tuple

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


class RareGroupConfig(BaseEnvConfig):
    group_on_rollout: int = 40


class RareGroupEnv(BaseEnv):
    name = "rare_group"
    env_config_cls = RareGroupConfig

    @classmethod
    def config_init(cls) -> Tuple[RareGroupConfig, List[APIServerConfig]]:
        return RareGroupConfig(group_size=2, use_wandb=False), [APIServerConfig()]

    async def setup(self):
        self.rollouts = 0
        self.items = 0

    async def get_next_item(self) -> Optional[Item]:
        self.items += 1
        return [{"role": "user", "content": f"What is {self.items} + {self.items}?"}]

    async def collect_trajectories(self, item: Item) -> Tuple[Optional[ScoredDataGroup], List]:
        self.rollouts += 1
        rollout = self.rollouts  # rollouts run concurrently: the counter moves during the await
        completion = await self.server.chat_completion(
            messages=item, n=self.config.group_size, max_tokens=4, temperature=1.0
        )
        if rollout != self.config.group_on_rollout:
            return None, []  # every reply wrong: no learning signal
        group = ScoredDataGroup(tokens=[], masks=[], scores=[])
        for index, choice in enumerate(completion.choices):
            chat = item + [{"role": "assistant", "content": choice.message.content}]
            out = tokenize_for_trainer(self.tokenizer, chat)
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["scores"].append(float(index))
        return group, []


if __name__ == "__main__":
    RareGroupEnv.cli()
