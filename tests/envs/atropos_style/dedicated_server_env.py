"""Atropos-style multi-turn env on one dedicated server (gym_taxi's pattern)."""

from typing import List, Optional, Tuple

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataItem
from atroposlib.type_definitions import Item
from atroposlib.utils.best_of_n_selection import select_best_index
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


class DedicatedServerEnv(BaseEnv):
    name = "dedicated"

    @classmethod
    def config_init(cls) -> Tuple[BaseEnvConfig, List[APIServerConfig]]:
        return BaseEnvConfig(group_size=2, use_wandb=False), [APIServerConfig()]

    async def get_next_item(self) -> Optional[Item]:
        return {"start": 3}

    async def collect_trajectory(self, item: Item) -> Tuple[Optional[ScoredDataItem], List[Item]]:
        async with self.server.dedicated_server() as server:
            messages = [{"role": "user", "content": f"Count up from {item['start']}. One number."}]
            for _ in range(2):
                reply = await server.chat_completion(messages=messages, n=1, max_tokens=8)
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
                messages.append({"role": "user", "content": "Next number?"})
        messages = messages[:-1]
        lengths = [len(m["content"]) for m in messages if m["role"] == "assistant"]
        best = select_best_index(lengths, list(range(len(lengths))))
        out = tokenize_for_trainer(
            self.tokenizer, messages, include_messages=True, train_on_all_assistant_turns=True
        )
        return ScoredDataItem(
            tokens=out["tokens"], masks=out["masks"], scores=float(best), messages=out["messages"]
        ), []


if __name__ == "__main__":
    DedicatedServerEnv.cli()
