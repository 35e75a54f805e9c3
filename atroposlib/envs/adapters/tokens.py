"""Token-in/token-out turns: the one path from an adapter's rollout to tokens, masks, logprobs.

A trajectory is built left to right and never re-tokenized: the prompt's ids (the chat
template applied once), the ids the inference server sampled (with their logprobs), then the
template's ids for each new env/tool/user message only, the next sampled ids, and so on.
Every request sends the whole id prefix, so the engine continues from exactly what is trained.
``scored_group`` turns finished trajectories and their scores into the group we post.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

from atroposlib.envs.groups import ScoredDataGroup
from atroposlib.envs.server_handling.managed import PROMPT_LOGPROB
from atroposlib.envs.server_handling.server_baseline import GeneratedSequence
from atroposlib.protocol import MASK_IGNORE_INDEX
from atroposlib.type_definitions import Message as ChatMessage

Message = dict[str, Any]

TOOLS_PROMPT = (
    "You can call these tools:\n<tools>\n{tools}\n</tools>\n"
    'To call one, reply <tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call> '
    "(one block per call). Answer in plain text when no tool is needed."
)
"""Tool list for chat templates that cannot render ``tools`` themselves (Hermes format)."""


class ContextFullError(Exception):
    """The prompt leaves no room to sample under ``max_token_length``."""


class TokenServer(Protocol):
    """What sampling needs of a server (``ServerManager`` fits)."""

    async def generate(
        self, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]: ...


def _text(content: Any) -> str:
    """Message content as the plain string chat templates expect (parts joined, None empty)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = [part.get("text", "") for part in content if isinstance(part, Mapping)]
    return "".join(str(part) for part in parts)


def _tool_calls_text(calls: Sequence[Mapping[str, Any]]) -> str:
    blocks = []
    for call in calls:
        function = call.get("function") or call
        arguments = function.get("arguments") or "{}"
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):
                arguments = json.loads(arguments)
        body = json.dumps({"name": function.get("name"), "arguments": arguments})
        blocks.append(f"<tool_call>{body}</tool_call>")
    return "".join(blocks)


class ChatTokens:
    """A tokenizer's chat template, applied once per prompt and then per new message only."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        template = str(getattr(tokenizer, "chat_template", "") or "")
        self.renders_tools = "tools" in template
        self.renders_tool_calls = "tool_calls" in template

    def normalize(self, messages: Sequence[Message]) -> list[Message]:
        """Messages the template can render: string content, tool calls as text if needed."""
        out: list[Message] = []
        for message in messages:
            plain: Message = {"role": message["role"], "content": _text(message.get("content"))}
            calls = message.get("tool_calls")
            if calls and self.renders_tool_calls:
                plain["tool_calls"] = list(calls)
            elif calls:
                plain["content"] += _tool_calls_text(calls)
            if message.get("tool_call_id") is not None:
                plain["tool_call_id"] = message["tool_call_id"]
            out.append(plain)
        return out

    def with_tools(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None
    ) -> tuple[list[Message], list[dict[str, Any]] | None]:
        """The messages plus ``tools`` as the template takes them (or in the system prompt)."""
        chat = self.normalize(messages)
        if not tools:
            return chat, None
        if self.renders_tools:
            return chat, [dict(tool) for tool in tools]
        listing = TOOLS_PROMPT.format(tools="\n".join(json.dumps(dict(t)) for t in tools))
        if chat and chat[0]["role"] == "system":
            chat[0] = {**chat[0], "content": f"{chat[0]['content']}\n\n{listing}"}
        else:
            chat.insert(0, {"role": "system", "content": listing})
        return chat, None

    def prompt_ids(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """The template applied to ``messages`` with the assistant's generation prompt."""
        chat, wire_tools = self.with_tools(messages, tools)
        kwargs: dict[str, Any] = {"tools": wire_tools} if wire_tools else {}
        ids = self.tokenizer.apply_chat_template(
            chat, tokenize=True, add_generation_prompt=True, **kwargs
        )
        if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def continuation_ids(
        self,
        history: Sequence[Message],
        new: Sequence[Message],
        last_sampled_id: int | None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Ids that close the last (sampled) assistant turn of ``history`` and add ``new``.

        The template renders ``history`` with a placeholder for the last reply, then ``new``
        and the next generation prompt; the text after the placeholder is this delta. When the
        engine already sampled the turn's end token (``last_sampled_id``), its text is left out.
        """
        if not history or history[-1]["role"] != "assistant":
            raise ValueError("messages can only be added after a sampled assistant turn")
        marker = f"<<reply-{uuid.uuid4().hex}>>"
        placeholder = {"role": "assistant", "content": marker}
        chat, wire_tools = self.with_tools([*history[:-1], placeholder, *new], tools)
        kwargs: dict[str, Any] = {"tools": wire_tools} if wire_tools else {}
        rendered = str(
            self.tokenizer.apply_chat_template(
                chat, tokenize=False, add_generation_prompt=True, **kwargs
            )
        )
        after = rendered[rendered.rindex(marker) + len(marker) :]
        if last_sampled_id is not None and last_sampled_id in self.special_ids:
            stop_text = str(self.tokenizer.decode([last_sampled_id]))
            if stop_text and after.startswith(stop_text):
                after = after[len(stop_text) :]
        return [int(i) for i in self.tokenizer.encode(after, add_special_tokens=False)]

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(int(i) for i in getattr(self.tokenizer, "all_special_ids", ()))

    def text(self, ids: Sequence[int]) -> str:
        """What a reply says: its ids decoded, special tokens left out."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))


@dataclass(frozen=True)
class TokenTrajectory:
    """One sequence: ids, trained mask (the id where sampled, -100 elsewhere), logprobs."""

    tokens: list[int]
    masks: list[int]
    logprobs: list[float]
    messages: list[Message] = field(default_factory=list)
    finish_reason: str | None = None
    turns: int = 0

    @classmethod
    def start(cls, prompt_ids: Sequence[int], messages: Sequence[Message] = ()) -> TokenTrajectory:
        n = len(prompt_ids)
        return cls(list(prompt_ids), [MASK_IGNORE_INDEX] * n, [PROMPT_LOGPROB] * n, list(messages))

    def with_sample(self, sample: GeneratedSequence, text: str) -> TokenTrajectory:
        """This trajectory followed by one sampled reply (its ids trained)."""
        ids = list(sample.output_ids)
        return replace(
            self,
            tokens=[*self.tokens, *ids],
            masks=[*self.masks, *ids],
            logprobs=[*self.logprobs, *sample.logprobs],
            messages=[*self.messages, {"role": "assistant", "content": text}],
            finish_reason=sample.finish_reason,
            turns=self.turns + 1,
        )

    def with_context(self, ids: Sequence[int], messages: Sequence[Message]) -> TokenTrajectory:
        """This trajectory followed by ids nobody sampled (env, tool or user messages)."""
        n = len(ids)
        return replace(
            self,
            tokens=[*self.tokens, *ids],
            masks=[*self.masks, *[MASK_IGNORE_INDEX] * n],
            logprobs=[*self.logprobs, *[PROMPT_LOGPROB] * n],
            messages=[*self.messages, *messages],
        )

    @property
    def last_sampled_id(self) -> int | None:
        sampled = [m for m in self.masks if m != MASK_IGNORE_INDEX]
        return sampled[-1] if sampled else None


async def sample_reply(
    server: TokenServer,
    prompt_ids: list[int],
    *,
    max_tokens: int,
    max_token_length: int,
    temperature: float,
    split: str = "train",
    **sampling: Any,
) -> GeneratedSequence:
    """One reply to the exact ``prompt_ids``, with ids and logprobs from the server.

    The reply is capped so prompt + reply fit ``max_token_length``; ContextFullError when
    the prompt alone fills it.
    """
    room = max_token_length - len(prompt_ids)
    if room <= 0:
        raise ContextFullError(
            f"the prompt has {len(prompt_ids)} tokens, max_token_length is {max_token_length}"
        )
    params = {"max_tokens": min(max_tokens, room), "temperature": temperature, "split": split}
    [reply] = await server.generate(prompt_ids, 1, {**params, **sampling})
    return reply


def scored_group(
    trajectories: Sequence[TokenTrajectory],
    scores: Sequence[float],
    *,
    overrides: Sequence[dict[str, Any]] | None = None,
    group_overrides: dict[str, Any] | None = None,
    include_messages: bool = True,
) -> ScoredDataGroup:
    """The group we post: one sequence per trajectory, engine logprobs aligned with tokens."""
    if len(trajectories) != len(scores):
        raise ValueError(f"{len(trajectories)} trajectories but {len(scores)} scores")
    group: ScoredDataGroup = {
        "tokens": [t.tokens for t in trajectories],
        "masks": [t.masks for t in trajectories],
        "scores": [float(s) for s in scores],
        "inference_logprobs": [t.logprobs for t in trajectories],
    }
    per_sequence = [dict(o) for o in overrides] if overrides else [{} for _ in trajectories]
    for extra, trajectory in zip(per_sequence, trajectories, strict=True):
        if trajectory.finish_reason is not None:
            extra.setdefault("finish_reason", trajectory.finish_reason)
            extra.setdefault("truncated", trajectory.finish_reason == "length")
    group["overrides"] = per_sequence
    if include_messages:
        group["messages"] = [cast(list[ChatMessage], t.messages) for t in trajectories]
    if group_overrides:
        group["group_overrides"] = dict(group_overrides)
    return group
