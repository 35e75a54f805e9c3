"""Atropos-style env whose group carries ``messages`` as one flat conversation (the prompt the
whole group answered), not one list per sequence: Atropos's ``process`` wrote such groups."""

from typing import List, Optional, Tuple

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

PROMPT = [
    {"role": "system", "content": "Answer with one word."},
    {"role": "user", "content": "Name a colour."},
]


class FlatMessagesEnv(BaseEnv):
    name = "flat_messages"

    @classmethod
    def config_init(cls) -> Tuple[BaseEnvConfig, List[APIServerConfig]]:
        return BaseEnvConfig(group_size=2, use_wandb=False), [APIServerConfig()]

    async def get_next_item(self) -> Optional[Item]:
        return PROMPT

    async def collect_trajectories(self, item: Item) -> Tuple[ScoredDataGroup, List[Item]]:
        completion = await self.server.chat_completion(
            messages=item, n=self.config.group_size, max_tokens=8, temperature=1.0
        )
        group = ScoredDataGroup(tokens=[], masks=[], scores=[])
        for index, choice in enumerate(completion.choices):
            chat = item + [{"role": "assistant", "content": choice.message.content}]
            out = tokenize_for_trainer(self.tokenizer, chat)
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["scores"].append(float(index))
        group["messages"] = item  # one conversation for the whole group
        return group, []


if __name__ == "__main__":
    FlatMessagesEnv.cli()
