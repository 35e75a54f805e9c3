"""The verifiers model client that samples through our ``ServerManager``, token-in/token-out.

verifiers (v1) routes every model call of a rollout through its interception server, which
asks a ``Client`` for a ``Response``; the response's ``TurnTokens`` (prompt ids, completion
ids, logprobs) become the trace's token graph. ``AtroposClient`` builds the prompt ids with
the shared ``ChatTemplate`` (the template once, then per-message deltas after the ids already
sampled) and samples with the env's ``TokenSampler``, so every branch of a trace is exactly
the ids sampled.

verifiers 0.4 has no plug-in point for clients: ``install()`` wraps its ``resolve_client`` so
an ``AtroposClientConfig`` resolves to our client and every other config as before.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
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

from atroposlib.envs.adapters.chat import template_messages
from atroposlib.envs.hermes import parse_tool_calls
from atroposlib.envs.rollouts import TokenSampler
from atroposlib.envs.trajectory import Trajectory
from atroposlib.errors import ContextFullError, InferenceError

logger = logging.getLogger(__name__)

CONTEXT_FULL = "max_token_length reached"
"""Text of the 400 answered when the conversation leaves no room to sample."""


@dataclass
class TokenRoute:
    """What one adapter env lends its rollouts: its token sampler (train or eval)."""

    sampler: TokenSampler
    failed_sessions: dict[str, str] = field(default_factory=dict)
    """Trace id -> why inference failed for it (infrastructure, not the model's fault)."""
    versions: dict[str, list[int | None]] = field(default_factory=lambda: defaultdict(list))
    """Trace id -> the engine's weight version of each reply sampled for it, in order."""


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


def reply_message(text: str) -> AssistantMessage:
    """A reply as verifiers' assistant message, ``<tool_call>`` blocks as its tool calls.

    >>> message = reply_message('ok <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    >>> message.content, [(c.name, c.arguments) for c in message.tool_calls]
    ('ok', [('f', '{"x": 1}')])
    >>> reply_message("<tool_call>{oops}</tool_call>").tool_calls is None
    True
    """
    content, calls = parse_tool_calls(text)
    tool_calls = [
        ToolCall(id=f"call_{index}", name=call["function"]["name"],
                 arguments=call["function"]["arguments"])
        for index, call in enumerate(calls)
    ]  # fmt: skip
    return AssistantMessage(content=content or None, tool_calls=tool_calls or None)


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
        top_p = {"top_p": sampling.top_p} if sampling.top_p is not None else {}
        try:
            [reply] = await lane.sampler.sample(Trajectory.start(prompt_ids, messages), **top_p)
        except ContextFullError as exc:
            raise ProviderError(f"{CONTEXT_FULL}: {exc}", status_code=400) from exc
        except InferenceError as exc:
            lane.failed_sessions[session_id or ""] = type(exc).__name__
            raise ProviderError(f"inference failed: {exc}", status_code=503) from exc
        lane.versions[session_id or ""].append(reply.oldest_version)
        return self._response(body, prompt_ids, reply, bridged)

    def _prompt_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        turn: PendingTurn | None,
    ) -> tuple[list[int], bool]:
        """The exact ids sampled so far plus the template delta of the new messages."""
        template = self.route.sampler.template
        previous = turn.previous_renderer_token_ids() if turn is not None else None
        tail = messages[turn.tail_start :] if turn is not None else []
        if previous is None or not tail or any(m["role"] == "assistant" for m in tail):
            return template.prompt_ids(*template_messages(template, messages, tools)), False
        prompt_ids, completion_ids = previous
        history = messages[: turn.tail_start]  # type: ignore[union-attr]
        chat, wire_tools = template_messages(template, [*history, *tail], tools)
        last = completion_ids[-1] if completion_ids else None
        stop = last if last in template.special_ids else None
        delta = template.continuation_ids(chat[: -len(tail)], chat[-len(tail) :], stop, wire_tools)
        return [*prompt_ids, *completion_ids, *delta], True

    def _response(
        self, body: dict, prompt_ids: list[int], reply: Trajectory, bridged: bool
    ) -> Response:
        output_ids = reply.reply_ids
        message = reply_message(reply.reply)
        finish = "length" if reply.truncated else "tool_calls" if message.tool_calls else "stop"
        model = str(body.get("model") or "atroposlib")
        response = Response(
            id=f"atropos-{uuid.uuid4().hex[:12]}",
            created=0,
            model=model,
            message=message,
            finish_reason=finish,
            usage=Usage(prompt_tokens=len(prompt_ids), completion_tokens=len(output_ids)),
            tokens=TurnTokens(
                prompt_ids=prompt_ids,
                completion_ids=output_ids,
                completion_logprobs=reply.logprobs[reply.reply_start :],
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
