"""Atropos-style env on the managed-server path: token ids and logprobs from the server,
``stop`` given as a token id, tools with the hermes parser (t1_env's pattern)."""

from typing import List, Optional, Tuple

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.server_handling.managed_server import SequenceNode
from atroposlib.type_definitions import Item
from atroposlib.utils.tool_call_parser import parse_tool_call

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


class ManagedToolsEnv(BaseEnv):
    name = "managed_tools"

    def __init__(self, config, server_configs, slurm=False, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.server.tool_parser = "hermes"

    @classmethod
    def config_init(cls) -> Tuple[BaseEnvConfig, List[APIServerConfig]]:
        return BaseEnvConfig(group_size=2, use_wandb=False), [APIServerConfig()]

    async def get_next_item(self) -> Optional[Item]:
        return "What is the weather in Paris? Call a tool."

    async def collect_trajectories(self, item: Item) -> Tuple[ScoredDataGroup, List[Item]]:
        messages = [{"role": "user", "content": item}]
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=messages,
                n=self.config.group_size,
                max_tokens=20,
                tools=TOOLS,
                stop=[self.tokenizer.eos_token_id],
            )
            nodes: List[SequenceNode] = managed.get_state()["nodes"]
        group = ScoredDataGroup(
            tokens=[], masks=[], scores=[], inference_logprobs=[], messages=[], overrides=[]
        )
        for choice, node in zip(completion.choices, nodes):
            raw = node.full_text
            name, _, error = parse_tool_call(raw, TOOLS)
            group["tokens"].append(node.tokens)
            group["masks"].append(node.masked_tokens)
            group["inference_logprobs"].append(node.logprobs)
            group["scores"].append(0.0 if error else 1.0)
            group["overrides"].append(
                {
                    "finish_reason": choice.finish_reason,
                    "tool_calls": len(choice.message.tool_calls or []),
                    "parsed": name,
                }
            )
            group["messages"].append(messages + [{"role": "assistant", "content": raw}])
        return group, []


if __name__ == "__main__":
    ManagedToolsEnv.cli()
