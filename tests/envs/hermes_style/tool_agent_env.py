"""A tool-calling agent env written the way hermes-agent writes its RL environments (our code):

- its config fields (``enabled_toolsets``, ``max_agent_turns``, ``agent_temperature``,
  ``terminal_backend``, ``tool_call_parser``, ``extra_body``, ...) on a BaseEnvConfig subclass;
- ``self.server.tool_parser`` set from the config, the managed path chosen with
  ``not isinstance(server, OpenAIServer)``;
- an agent loop of ``chat_completion(messages=..., tools=...)`` calls inside
  ``self.server.managed_server(tokenizer=..., preserve_think_blocks=...)``, tool calls read
  from ``message.tool_calls`` and answered with ``tool`` messages;
- the trajectory from ``get_state()["nodes"][-1]``: ``tokens``, ``masked_tokens``, ``logprobs``.

The test model calls ``search`` greedily on ``tool_chat.few_shot`` rendered by
``hermes_tools.jinja`` (set as the tokenizer's template).
"""

import json
from typing import Any, Dict, List, Optional, Tuple

from pydantic import Field
from tool_chat import TEMPLATE, TOOLS, few_shot

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataItem
from atroposlib.type_definitions import Item


class ToolAgentEnvConfig(BaseEnvConfig):
    enabled_toolsets: Optional[List[str]] = Field(default=None, description="Toolsets offered.")
    disabled_toolsets: Optional[List[str]] = Field(default=None, description="Toolsets removed.")
    distribution: Optional[str] = Field(default=None, description="Toolset distribution name.")
    max_agent_turns: int = Field(default=2, description="Model calls per rollout.")
    system_prompt: Optional[str] = Field(default=None, description="System prompt, if any.")
    agent_temperature: float = Field(default=0.0, description="Sampling temperature.")
    terminal_backend: str = Field(default="local", description="Where tools run.")
    tool_call_parser: str = Field(default="hermes", description="Parser of the model's calls.")
    thinking_mode: bool = Field(default=False, description="Keep <think> blocks in history.")
    extra_body: Optional[Dict[str, Any]] = Field(default=None, description="Extra request keys.")
    max_reply_tokens: int = Field(default=40, description="max_tokens of each model call.")


def search(arguments: Dict[str, Any]) -> str:
    return f"3 results for {arguments.get('q')!r}"


class ToolAgentEnv(BaseEnv):
    name = "hermes_style_tool_agent"
    env_config_cls = ToolAgentEnvConfig

    def __init__(self, config, server_configs, slurm=False, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        if hasattr(self.server, "tool_parser"):
            self.server.tool_parser = config.tool_call_parser
        self._current_group_tools: Optional[List[Dict[str, Any]]] = None

    @classmethod
    def config_init(cls) -> Tuple[ToolAgentEnvConfig, List[APIServerConfig]]:
        config = ToolAgentEnvConfig(group_size=2, max_token_length=2048, use_wandb=False,
                                    ensure_scores_are_not_same=False)  # fmt: skip
        return config, [APIServerConfig(server_type="embedded")]

    async def setup(self) -> None:
        self.tokenizer.chat_template = TEMPLATE.read_text()
        self.queries, self.index = ["birds", "trees", "rivers"], 0

    async def get_next_item(self) -> Optional[Item]:
        query = self.queries[self.index % len(self.queries)]
        self.index += 1
        return query

    def _use_managed_server(self) -> bool:
        if not self.server.servers:
            return False
        from atroposlib.envs.server_handling.openai_server import OpenAIServer

        return not isinstance(self.server.servers[0], OpenAIServer)

    async def collect_trajectories(self, item: Item):
        self._current_group_tools = TOOLS  # resolved once per group
        try:
            return await super().collect_trajectories(item)
        finally:
            self._current_group_tools = None

    async def collect_trajectory(self, item: Item) -> Tuple[Optional[ScoredDataItem], List[Item]]:
        messages: List[Dict[str, Any]] = few_shot(item)
        if self.config.system_prompt:
            messages.insert(0, {"role": "system", "content": self.config.system_prompt})
        start = len(messages)
        if not self._use_managed_server():
            return None, []  # this env trains on the managed path only
        async with self.server.managed_server(
            tokenizer=self.tokenizer, preserve_think_blocks=bool(self.config.thinking_mode)
        ) as managed:
            calls = await self._agent_loop(managed, messages)
            nodes = managed.get_state()["nodes"]
        node = nodes[-1]
        scored = ScoredDataItem(
            tokens=node.tokens,
            masks=node.masked_tokens,
            scores=1.0 if "search" in calls else 0.0,
            inference_logprobs=node.logprobs,
            messages=messages[start - 1 :],
        )
        return scored, []

    async def _agent_loop(self, server: Any, messages: List[Dict[str, Any]]) -> List[str]:
        """Model turns until a reply without tool calls; returns the names called."""
        called: List[str] = []
        for _ in range(self.config.max_agent_turns):
            kwargs: Dict[str, Any] = {"messages": messages, "n": 1,
                                      "temperature": self.config.agent_temperature,
                                      "max_tokens": self.config.max_reply_tokens,
                                      "tools": self._current_group_tools or TOOLS}  # fmt: skip
            if self.config.extra_body:
                kwargs["extra_body"] = self.config.extra_body
            reply = (await server.chat_completion(**kwargs)).choices[0].message
            if not reply.tool_calls:
                messages.append({"role": "assistant", "content": reply.content or ""})
                break
            calls = [
                call if isinstance(call, dict) else call.model_dump() for call in reply.tool_calls
            ]
            messages.append({"role": "assistant", "content": reply.content, "tool_calls": calls})
            for call in calls:
                called.append(call["function"]["name"])
                result = search(json.loads(call["function"]["arguments"] or "{}"))
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        return called


if __name__ == "__main__":
    ToolAgentEnv.cli()
