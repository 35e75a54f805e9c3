"""One proxy session: an agent's conversation, recorded token-exactly by a managed server.

The agent speaks OpenAI chat (structured ``tool_calls``, tool results); the recorder keeps the
exact ids the engine saw and sampled. Between the two, :class:`ReplyMemory` remembers the raw
text behind every reply the session returned, so when the agent sends a reply back as history
(its ``tool_calls``, its content) the prompt is rendered with exactly what the model wrote and
the request continues the recorded node instead of re-tokenizing a paraphrase of it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from jinja2 import TemplateError
from pydantic import BaseModel

from atroposlib.envs.hermes import tool_calls_as_text, tools_prompt
from atroposlib.envs.server_handling.managed import SequenceNode
from atroposlib.envs.server_handling.managed_server import ManagedServer
from atroposlib.envs.server_handling.server_baseline import APIServer, TokenAnswer
from atroposlib.envs.server_handling.session_server import (
    REASON_CHARS,
    base_url_of,
    sampled_on,
)
from atroposlib.envs.server_handling.tool_call_translator import ToolCallTranslator
from atroposlib.errors import InferenceError, InferenceRejectedError
from atroposlib.proxy.protocol import (
    AssistantMessage,
    ChatCompletionProxyRequest,
    ProxyChoice,
    ToolCall,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


class TemplateRenderError(ValueError):
    """The chat template cannot render the request's messages (the message says why)."""


class MalformedInferenceAnswer(InferenceError):
    """The inference server's token answer does not fit together (lengths, counts, types)."""


class ReplyMemory:
    """Raw model text behind the replies a session returned, by tool call id and content."""

    def __init__(self) -> None:
        self._by_call_id: dict[str, str] = {}
        self._by_content: dict[str, str] = {}

    def remember(self, raw: str, message: AssistantMessage) -> None:
        for call in message.tool_calls or []:
            self._by_call_id[call.id] = raw
        if not message.tool_calls and message.content is not None and message.content != raw:
            self._by_content[message.content] = raw

    def restore(self, message: dict[str, Any], template_renders_calls: bool) -> dict[str, Any]:
        """``message`` as the model wrote it when this session produced it; an assistant
        message with unknown tool calls becomes Hermes text unless the template renders them."""
        if message["role"] != "assistant":
            return message
        calls = message.get("tool_calls") or []
        known = [self._by_call_id[c["id"]] for c in calls if c["id"] in self._by_call_id]
        if calls and len(known) == len(calls) and len(set(known)) == 1:
            return {"role": "assistant", "content": known[0]}
        if calls:
            return message if template_renders_calls else tool_calls_as_text(message)
        content = message.get("content")
        if isinstance(content, str) and content in self._by_content:
            return {**message, "content": self._by_content[content]}
        return message


def _renders(tokenizer: Any, key: str) -> bool:
    """Whether the tokenizer's chat template uses ``key``; a tokenizer without a template
    string (its own ``apply_chat_template``) is trusted to."""
    template = getattr(tokenizer, "chat_template", None)
    return not isinstance(template, str) or key in template


def with_tools_listed(messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> None:
    """List ``tools`` in the system prompt (Hermes style), in place."""
    listing = tools_prompt([tool.get("function", tool) for tool in tools])
    if messages and messages[0]["role"] == "system":
        messages[0] = {**messages[0], "content": f"{messages[0]['content'] or ''}\n\n{listing}"}
    else:
        messages.insert(0, {"role": "system", "content": listing})


class PinnedBackend:
    """One inference server as managed mode's token backend, with retries on transient
    failures. Our servers sample with ``generate``, and the weight version of each sample of
    the last call is kept in ``last_versions``; any other server object is asked Atropos's
    token call (``tokens_and_logprobs_completion``), checked for a well-formed answer.

    ``spare``: given the failed server, another to move the session to (None: none, or the
    session asked for its server by ``base_url``); each move is kept in ``moves`` and named in
    the nodes sampled after it (:meth:`node_metadata`)."""

    def __init__(
        self, server: Any, attempts: int, spare: Callable[[Any], Any | None] | None = None
    ) -> None:
        self.server = server
        self.config = getattr(server, "config", None)
        self.attempts = attempts
        self.spare = spare
        self.last_versions: list[int | None] = []
        self.turns = 0
        self.moves: list[dict[str, Any]] = []

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> TokenAnswer:
        self.turns += 1
        try:
            return await self._sample_on(self.server, kwargs)
        except InferenceRejectedError:
            raise
        except InferenceError as exc:
            spare = self.spare(self.server) if self.spare is not None else None
            if spare is None:
                raise
            move = {"turn": self.turns, "from": base_url_of(self.server), "to": base_url_of(spare)}
            self.moves.append({**move, "reason": str(exc)[:REASON_CHARS]})
            logger.warning("proxy session moved from %s to %s: %s",
                           base_url_of(self.server), base_url_of(spare), exc)  # fmt: skip
            self.server, self.config = spare, getattr(spare, "config", None)
            return await self._sample_on(spare, kwargs)

    async def _sample_on(self, server: Any, kwargs: dict[str, Any]) -> TokenAnswer:
        n = int(kwargs.get("n") or 1)
        self.last_versions = []
        if _speaks_generate(server):
            input_ids = list(kwargs["input_ids"])
            sampling = {k: v for k, v in kwargs.items()
                        if k not in ("prompt", "input_ids", "n", "model")}  # fmt: skip
            samples = await self._retrying(lambda: server.generate(input_ids, n, sampling))
            self.last_versions = [sample.weight_version for sample in samples]
            return (input_ids, [s.output_ids for s in samples], [s.logprobs for s in samples],
                    [s.finish_reason for s in samples])  # fmt: skip
        answer = await self._retrying(lambda: server.tokens_and_logprobs_completion(**kwargs))
        return checked_token_answer(answer, n)

    def node_metadata(self) -> dict[str, Any]:
        """The server that sampled the node, and the session's moves so far (if any)."""
        return sampled_on(self.server, self.moves)

    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        for attempt in range(1, self.attempts + 1):
            try:
                return await call()
            except InferenceRejectedError:
                raise
            except InferenceError as exc:
                if attempt == self.attempts:
                    raise
                logger.warning("proxy sample attempt %d failed (%s); retrying", attempt, exc)
                await asyncio.sleep(min(5.0, 0.25 * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")


class SessionRecorder(ManagedServer):
    """The session's managed server over a :class:`PinnedBackend`; nodes also carry the
    oldest weight version that sampled any of their ids (``metadata["weight_version"]``)."""

    def __init__(
        self,
        server: Any,
        tokenizer: Any,
        tool_parser: str,
        attempts: int,
        spare: Callable[[Any], Any | None] | None = None,
    ) -> None:
        self.backend = PinnedBackend(server, attempts, spare)
        super().__init__(self.backend, tokenizer, tool_parser=tool_parser)

    def input_ids_for(self, prompt: str) -> list[int]:
        """The ids a chat request for ``prompt`` sends: the node it extends, as recorded,
        then the new text tokenized."""
        parent = self._longest_prefix_node(prompt)
        if parent is None:
            return self._encode(prompt, False)
        return [*parent.tokens, *self._encode(prompt[len(parent.full_text) :], False)]

    async def _sample(
        self, prompt: str, n: int, sampling: dict[str, Any], *, add_special_tokens: bool
    ) -> list[tuple[SequenceNode, list[int]]]:
        parent = self._longest_prefix_node(prompt)
        older = (parent.metadata or {}).get("weight_version") if parent is not None else None
        sampled = await super()._sample(prompt, n, sampling, add_special_tokens=add_special_tokens)
        for (node, _), version in zip(sampled, self.backend.last_versions, strict=False):
            known = [v for v in (older, version) if v is not None]
            if known:
                node.metadata = {**(node.metadata or {}), "weight_version": min(known)}
        return sampled


def _speaks_generate(server: Any) -> bool:
    """Whether to sample with our ``generate``: a server of ours whose Atropos token call is
    the one built on it (a server answering that call its own way is asked that way)."""
    return (
        isinstance(server, APIServer)
        and type(server).tokens_and_logprobs_completion is APIServer.tokens_and_logprobs_completion
    )


def checked_token_answer(answer: Any, n: int) -> TokenAnswer:
    """Atropos's ``(prompt ids, outputs, logprobs, finish reasons)`` with plain ints and
    floats, or MalformedInferenceAnswer when the parts do not fit together."""
    try:
        prompt_ids, outputs, logprobs, reasons = answer
        rows = [
            ([int(t) for t in ids], [float(lp) for lp in lps], _reason(reason))
            for ids, lps, reason in zip(outputs, logprobs, reasons, strict=True)
        ]
        prompt = [int(t) for t in prompt_ids]
    except (TypeError, ValueError) as exc:
        raise MalformedInferenceAnswer(f"the token answer is malformed: {exc}") from exc
    if len(rows) != n or any(len(ids) != len(lps) for ids, lps, _ in rows):
        raise MalformedInferenceAnswer(
            f"the token answer has {len(rows)} choices for n={n}, or logprobs that do not "
            "match their ids one for one"
        )
    return prompt, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


def _reason(reason: Any) -> str:
    return str(reason.get("type", "stop")) if isinstance(reason, dict) else str(reason)


@dataclass
class ProxySession:
    """What the proxy keeps per session id."""

    uuid: str
    recorder: SessionRecorder
    model_name: str
    tool_parser: str
    base_url: str | None
    temperature: float | None = None
    client: str = ""
    """Who created it (the connection's peer address, never a forwarded header): per-client
    caps count by it."""
    token: str = field(default="", repr=False)
    """The session's own key (:mod:`.access`); empty: no token opens it."""
    created_at: float = field(default_factory=time.time)
    last_accessed: float = field(default_factory=time.time)
    memory: ReplyMemory = field(default_factory=ReplyMemory)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def nodes(self) -> list[SequenceNode]:
        return list(self.recorder.nodes)

    @property
    def managed_server(self) -> SessionRecorder:
        """Atropos's name for the session's managed server."""
        return self.recorder

    @property
    def translator(self) -> ToolCallTranslator | None:
        """The session's tool-call translator (Atropos's name); None without a parser."""
        return self.recorder._get_translator()

    @property
    def recorded_bytes(self) -> int:
        """What its nodes hold: their text, and 8 bytes per id, mask and logprob."""
        return sum(
            len(n.full_text) + 8 * (len(n.tokens) + len(n.masked_tokens) + len(n.logprobs))
            for n in self.recorder.nodes
        )

    def touch(self) -> None:
        self.last_accessed = time.time()

    def prompt_messages(self, request: ChatCompletionProxyRequest) -> list[dict[str, Any]]:
        """The request's messages as the model saw (or will see) them."""
        tokenizer = self.recorder.tokenizer
        renders_calls = _renders(tokenizer, "tool_calls")
        messages = [self.memory.restore(m, renders_calls) for m in request.template_messages()]
        for index, message in enumerate(messages):
            if message.get("content") is None:
                messages[index] = {**message, "content": ""}
        tools = request.template_tools()
        if tools and not _renders(tokenizer, "tools"):
            with_tools_listed(messages, tools)
        return messages

    def render(self, request: ChatCompletionProxyRequest) -> tuple[str, list[int]]:
        """(prompt text, the ids a request would send)."""
        prompt = self._render(self.prompt_messages(request), request.template_tools())
        return prompt, self.recorder.input_ids_for(prompt)

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        try:
            return self.recorder.render_prompt(messages, tools)
        except (TemplateError, TypeError, ValueError, KeyError) as exc:
            raise TemplateRenderError(
                f"messages: the chat template cannot render them: {type(exc).__name__}: {exc}"
            ) from exc

    async def complete(
        self, request: ChatCompletionProxyRequest, default_max_tokens: int
    ) -> list[ProxyChoice]:
        """Sample the request's replies, record them, remember their raw text."""
        messages = self.prompt_messages(request)
        tools = request.template_tools()
        tool_choice = request.tool_choice
        choice_arg = tool_choice.model_dump() if isinstance(tool_choice, BaseModel) else tool_choice
        prompt = self._render(messages, tools)
        async with self.lock:  # one request at a time extends this session's nodes
            completion = await self.recorder.chat_completion(
                messages=messages,
                n=request.n,
                tools=tools,
                tool_choice=choice_arg,
                **request.sampling(self.temperature, default_max_tokens),
            )
            nodes = self.recorder.nodes[-len(completion.choices) :]
        choices = []
        for choice, node in zip(completion.choices, nodes, strict=True):
            parsed = choice.message.tool_calls or []
            calls = [ToolCall.model_validate(c.model_dump()) for c in parsed]
            message = AssistantMessage(content=choice.message.content, tool_calls=calls or None)
            self.memory.remember(self._raw_reply(node, prompt), message)
            choices.append(
                ProxyChoice(index=choice.index, message=message, finish_reason=choice.finish_reason)
            )
        return choices

    def _raw_reply(self, node: SequenceNode, prompt: str) -> str:
        """What the model wrote, without the end-of-turn token the template adds back."""
        raw = node.full_text[len(prompt) :]
        tokenizer = self.recorder.tokenizer
        if node.tokens and node.tokens[-1] in set(getattr(tokenizer, "all_special_ids", ())):
            stop_text = str(tokenizer.decode([node.tokens[-1]], skip_special_tokens=False))
            if stop_text and raw.endswith(stop_text):
                raw = raw[: -len(stop_text)]
        return raw


SessionState = ProxySession
"""Atropos's name."""
