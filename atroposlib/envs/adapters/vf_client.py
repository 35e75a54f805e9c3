"""The verifiers model client that samples through our ``ServerManager``, token-in/token-out.

verifiers (v1) routes every model call of a rollout through its interception server, which
asks a ``Client`` for a ``Response``; the response's ``TurnTokens`` (prompt ids, completion
ids, logprobs) become the trace's token graph. ``AtroposClient`` builds the prompt ids with
``ChatTokens`` (the template once, then per-message deltas after the ids already sampled) and
samples with ``ServerManager.generate``, so every branch of a trace is exactly the ids sampled.

verifiers 0.4 has no plug-in point for clients: ``install()`` wraps its ``resolve_client`` so
an ``AtroposClientConfig`` resolves to our client and every other config as before.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verifiers.v1.clients import Client
from verifiers.v1.clients.train import serialize_completion, tool_to_wire
from verifiers.v1.configs.client import TrainClientConfig
from verifiers.v1.dialects import ChatDialect, Dialect
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.errors import ProviderError
from verifiers.v1.graph import PendingTurn
from verifiers.v1.types import (
    AssistantMessage,
    Response,
    SamplingConfig,
    ToolCall,
    TurnTokens,
    Usage,
)

from atroposlib.envs.adapters.tokens import ChatTokens, ContextFullError, TokenServer, sample_reply
from atroposlib.errors import InferenceError

logger = logging.getLogger(__name__)

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
CONTEXT_FULL = "max_token_length reached"
"""Text of the 400 answered when the conversation leaves no room to sample."""


@dataclass
class TokenRoute:
    """What one adapter env lends its rollouts: server, template, sampling budget."""

    server: TokenServer
    chat: ChatTokens
    max_token_length: int
    max_tokens: int
    temperature: float
    split: str = "train"
    failed_sessions: dict[str, str] = field(default_factory=dict)
    """Trace id -> why inference failed for it (infrastructure, not the model's fault)."""


_ROUTES: dict[str, TokenRoute] = {}


def register_route(token_route: TokenRoute) -> str:
    key = uuid.uuid4().hex
    _ROUTES[key] = token_route
    return key


def route(key: str) -> TokenRoute:
    return _ROUTES[key]


class AtroposClientConfig(TrainClientConfig):
    """Client config naming a live ``TokenRoute`` (never sent anywhere)."""

    route: str = ""
    api_key_var: str = "ATROPOS_VERIFIERS_UNUSED_KEY"
    base_url: str = "http://atroposlib.invalid/v1"


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """``<tool_call>{json}</tool_call>`` blocks as calls, and the text around them.

    >>> content, calls = parse_tool_calls('ok <tool_call>{"name": "f", "arguments": {"x": 1}}'
    ...                                    '</tool_call>')
    >>> content, [(c.name, c.arguments) for c in calls]
    ('ok', [('f', '{"x": 1}')])
    >>> parse_tool_calls("<tool_call>{oops}</tool_call>")[1]
    []
    """
    calls: list[ToolCall] = []
    for index, block in enumerate(_TOOL_CALL.findall(text)):
        try:
            decoded = json.loads(block)
        except ValueError:
            continue
        if not isinstance(decoded, dict) or not isinstance(decoded.get("name"), str):
            continue
        arguments = decoded.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        calls.append(ToolCall(id=f"call_{index}", name=decoded["name"], arguments=arguments))
    content = _TOOL_CALL.sub("", text).strip() if calls else text
    return content, calls


class AtroposClient(Client):
    """Renders the prompt to ids (extending the sampled prefix) and samples through our server."""

    def __init__(self, config: AtroposClientConfig) -> None:
        if config.route not in _ROUTES:
            raise ValueError(f"no live atroposlib route {config.route!r} in this process")
        self.config = config
        self.route = _ROUTES[config.route]

    async def get_response(
        self,
        dialect: Dialect,
        body: dict,
        sampling: SamplingConfig,
        session_id: str | None = None,
        turn: PendingTurn | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        if not isinstance(dialect, ChatDialect):
            raise ProviderError(
                f"the adapter samples chat completions only, not {type(dialect).__name__}",
                status_code=400,
            )
        request = dialect.parse_request(body) if turn is None else None
        prompt = turn.prompt if turn is not None else request.messages  # type: ignore[union-attr]
        tools = turn.tools if turn is not None else request.tools  # type: ignore[union-attr]
        wire_tools = [tool_to_wire(t)["function"] for t in tools] if tools else None
        messages = [message_to_wire(m) for m in prompt]
        prompt_ids, bridged = self._prompt_ids(messages, wire_tools, turn)
        lane = self.route
        temperature = lane.temperature if sampling.temperature is None else sampling.temperature
        try:
            sample = await sample_reply(
                lane.server,
                prompt_ids,
                max_tokens=sampling.max_tokens or lane.max_tokens,
                max_token_length=lane.max_token_length,
                temperature=temperature,
                split=lane.split,
                **({"top_p": sampling.top_p} if sampling.top_p is not None else {}),
            )
        except ContextFullError as exc:
            raise ProviderError(f"{CONTEXT_FULL}: {exc}", status_code=400) from exc
        except InferenceError as exc:
            lane.failed_sessions[session_id or ""] = type(exc).__name__
            raise ProviderError(f"inference failed: {exc}", status_code=503) from exc
        return self._response(body, prompt_ids, sample.output_ids, sample.logprobs,
                              sample.finish_reason, bridged)  # fmt: skip

    def _prompt_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        turn: PendingTurn | None,
    ) -> tuple[list[int], bool]:
        """The exact ids sampled so far plus the template delta of the new messages."""
        chat = self.route.chat
        previous = turn.previous_renderer_token_ids() if turn is not None else None
        tail = messages[turn.tail_start :] if turn is not None else []
        if previous is None or not tail or any(m["role"] == "assistant" for m in tail):
            return chat.prompt_ids(messages, tools), False
        prompt_ids, completion_ids = previous
        history = messages[: turn.tail_start]  # type: ignore[union-attr]
        delta = chat.continuation_ids(history, tail, completion_ids[-1], tools)
        return [*prompt_ids, *completion_ids, *delta], True

    def _response(
        self,
        body: dict,
        prompt_ids: list[int],
        output_ids: list[int],
        logprobs: list[float],
        finish_reason: str,
        bridged: bool,
    ) -> Response:
        text = self.route.chat.text(output_ids)
        content, calls = parse_tool_calls(text)
        finish = "length" if finish_reason == "length" else "tool_calls" if calls else "stop"
        model = str(body.get("model") or "atroposlib")
        response = Response(
            id=f"atropos-{uuid.uuid4().hex[:12]}",
            created=0,
            model=model,
            message=AssistantMessage(content=content or None, tool_calls=calls or None),
            finish_reason=finish,
            usage=Usage(prompt_tokens=len(prompt_ids), completion_tokens=len(output_ids)),
            tokens=TurnTokens(
                prompt_ids=prompt_ids,
                completion_ids=list(output_ids),
                completion_logprobs=list(logprobs),
                bridged=bridged,
            ),
        )
        response.raw = serialize_completion(response, model)
        return response


def install() -> None:
    """Make verifiers' interception server resolve ``AtroposClientConfig`` to our client."""
    from verifiers.v1.interception import server as interception_server

    original = interception_server.resolve_client
    if getattr(original, "atroposlib_route", False):
        return

    def resolve_client(config: Any) -> Client:
        if isinstance(config, AtroposClientConfig):
            return AtroposClient(config)
        return original(config)

    setattr(resolve_client, "atroposlib_route", True)  # noqa: B010 - a marker on a function
    interception_server.resolve_client = resolve_client
