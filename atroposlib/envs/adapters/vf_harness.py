"""An in-process chat harness for verifiers environments (harness id ``atropos_chat``).

verifiers' own chat loop (the ``null`` harness) is a PEP 723 script it installs with ``uv``
for every runtime, which needs the network and a process per rollout. This harness runs the
same loop in our process: chat completions through the rollout's interception endpoint (so
verifiers records the trace, applies stops and intercepts), MCP tools called with verifiers'
own MCP helpers, until a reply without tool calls. Resumed exchanges (a user simulator, a
scripted user) relaunch on the accumulated conversation, as verifiers' default does.
"""

from __future__ import annotations

import logging
import sys
from contextlib import AsyncExitStack
from typing import Any

import httpx
from openai import APIConnectionError, APIStatusError, AsyncOpenAI, omit
from verifiers.v1.clients import ModelContext
from verifiers.v1.configs.harness import HarnessConfig
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.errors import MODEL_TRANSPORT_ERROR_EXIT_CODE
from verifiers.v1.harness import Harness
from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp
from verifiers.v1.runtimes import ProgramResult, Runtime
from verifiers.v1.task import TaskData
from verifiers.v1.trace import Trace

from atroposlib.envs.adapters.vf_client import CONTEXT_FULL
from atroposlib.errors import ModelOutputError
from atroposlib.utils.bounded_json import loads_model_output

logger = logging.getLogger(__name__)

HARNESS_ID = "atropos_chat"
__all__ = ["InProcessChatConfig", "InProcessChatHarness"]


class InProcessChatConfig(HarnessConfig):
    id: str = HARNESS_ID
    max_tool_calls: int = 32
    """Tool calls one segment may make before it ends."""


def initial_messages(system: str | None, prompt: Any) -> list[dict[str, Any]]:
    """The chat the segment opens with: system prompt, then the task's prompt."""
    messages = [{"role": "system", "content": system}] if system else []
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    elif prompt:
        messages.extend(message_to_wire(message) for message in prompt)
    return messages


class InProcessChatHarness(Harness[InProcessChatConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: ModelContext,
        trace: Trace,
        runtime: Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: TaskData,
    ) -> ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages = initial_messages(system, prompt)
        http = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0))
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0, http_client=http)
        try:
            async with AsyncExitStack() as stack:
                servers_config = {
                    name: {"url": url, "timeout": self.config.tool_timeout}
                    for name, url in mcp_urls.items()
                }
                tools, dispatch, servers = (
                    await connect_mcp({"mcpServers": servers_config}, stack)
                    if servers_config
                    else ([], {}, {})
                )
                return await self._chat(client, ctx.model, messages, tools, dispatch, servers)
        finally:
            await client.close()

    async def _chat(
        self,
        client: AsyncOpenAI,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        dispatch: dict[str, Any],
        servers: dict[str, Any],
    ) -> ProgramResult:
        calls_made = 0
        while True:
            try:
                completion = await client.chat.completions.create(
                    model=model,
                    messages=messages,  # type: ignore[arg-type]
                    tools=tools if tools else omit,  # type: ignore[arg-type]
                )
            except APIConnectionError as exc:
                return ProgramResult(exit_code=MODEL_TRANSPORT_ERROR_EXIT_CODE, stdout="",
                                     stderr=str(exc))  # fmt: skip
            except APIStatusError as exc:
                if exc.status_code == 400 and CONTEXT_FULL in str(exc):
                    return ProgramResult(exit_code=0, stdout="", stderr="")  # a budget, not a crash
                return ProgramResult(exit_code=1, stdout="", stderr=f"model call: {exc}")
            message = completion.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls or calls_made >= self.config.max_tool_calls:
                return ProgramResult(exit_code=0, stdout="", stderr="")
            for call in message.tool_calls:
                calls_made += 1
                function = getattr(call, "function", None)
                name = function.name if function is not None else ""
                content = await self._call_tool(name, function, dispatch, servers)
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "name": name, "content": content}
                )

    async def _call_tool(
        self, name: str, function: Any, dispatch: dict[str, Any], servers: dict[str, Any]
    ) -> Any:
        """The tool's answer as text; a bad call is answered, not raised (the model's fault)."""
        try:
            arguments = loads_model_output(function.arguments or "{}")
        except ModelOutputError as exc:
            return f"error: invalid JSON in tool arguments ({exc}); resend valid JSON"
        if not isinstance(arguments, dict):
            return "error: tool arguments must be a JSON object"
        if name not in dispatch:
            return f"error: unknown tool {name!r}"
        return await call_mcp(servers, dispatch, name, arguments)


def register() -> None:
    """Make the harness id importable as verifiers resolves plugins (a top-level module)."""
    sys.modules.setdefault(HARNESS_ID, sys.modules[__name__])
