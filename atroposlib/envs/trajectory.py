"""A trajectory in token ids: the exact sequence an inference engine saw and sampled.

It is built once, left to right, and never re-tokenized: the prompt's ids (the chat template
applied once), then the ids the engine sampled, then the template's ids for each new env or
tool message (only that message's part of the template), then the next sampled ids, and so on.
Each request sends the whole id prefix, so the engine continues from exactly what is trained.
Text is derived from ids (for scoring and logs), never the other way round.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, get_args

from atroposlib.group import MASK_IGNORE_INDEX, NOT_SAMPLED_VERSION, PROMPT_LOGPROB, FinishReason
from atroposlib.type_definitions import Message

_FINISH_REASONS: frozenset[str] = frozenset(get_args(FinishReason))


def finish_reason(reason: Any) -> FinishReason:
    """An engine's finish reason as one of the declared ones (unknown values: ``stop``).

    >>> finish_reason("length"), finish_reason({"type": "abort"}), finish_reason("eos")
    ('length', 'abort', 'stop')
    """
    if isinstance(reason, dict):
        reason = reason.get("type")
    return reason if reason in _FINISH_REASONS else "stop"


Tools = Sequence[dict[str, Any]]
"""Tool schemas for a template that renders ``tools`` (else list them in the system prompt,
``atroposlib.envs.hermes.tools_prompt``)."""


def _tools_kwarg(tools: Tools | None) -> dict[str, Any]:
    return {"tools": list(tools)} if tools else {}


class ChatTemplate:
    """A tokenizer's chat template, applied once per prompt and then per new message only."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.special_ids: frozenset[int] = frozenset(getattr(tokenizer, "all_special_ids", ()))
        template = str(getattr(tokenizer, "chat_template", "") or "")
        self.renders_tools = "tools" in template
        self.renders_tool_calls = "tool_calls" in template

    def prompt_ids(self, messages: Sequence[Message], tools: Tools | None = None) -> list[int]:
        """The template applied to ``messages`` (and ``tools``) with the generation prompt."""
        ids = self.tokenizer.apply_chat_template(
            list(messages), tokenize=True, add_generation_prompt=True, **_tools_kwarg(tools)
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def continuation_ids(
        self,
        history: Sequence[Message],
        new: Sequence[Message],
        sampled_stop: int | None,
        tools: Tools | None = None,
    ) -> list[int]:
        """Ids that close the last (sampled) assistant turn of ``history`` and add ``new``.

        The template renders ``history`` with a placeholder for the last reply, then ``new``
        and the next generation prompt; the text after the placeholder is this delta. If the
        engine already sampled the turn's end token (``sampled_stop``), its text is dropped
        from the delta.
        """
        if not history or history[-1]["role"] != "assistant":
            raise ValueError("messages can only be added after a sampled assistant turn")
        marker = f"<<reply-{uuid.uuid4().hex}>>"
        reply = {k: v for k, v in history[-1].items() if k != "tool_calls"}  # in its ids
        chat = [*history[:-1], {**reply, "content": marker}, *new]
        rendered = self.tokenizer.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=True, **_tools_kwarg(tools)
        )
        after = str(rendered)[str(rendered).rindex(marker) + len(marker) :]
        if sampled_stop is not None:
            stop_text = str(self.tokenizer.decode([sampled_stop]))
            if stop_text and after.startswith(stop_text):
                after = after[len(stop_text) :]
        return [int(i) for i in self.tokenizer.encode(after, add_special_tokens=False)]

    def text(self, ids: Sequence[int]) -> str:
        """What a reply says: its ids decoded, special tokens left out."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))


@dataclass(frozen=True)
class Trajectory:
    """One sequence: ids with their trained mask, sampling logprobs and weight versions.

    ``masks`` holds the id where the engine sampled it and -100 elsewhere; ``logprobs`` the
    engine's logprob of each sampled id (1.0 elsewhere); ``versions`` the engine's weight
    version for each sampled id (-1 elsewhere), so a reply sampled across a weight update
    carries both versions. ``messages`` is the chat as text, for logs. A reply the engine
    aborted (``finish_reason == "abort"``) is continued, not followed, by the next sample: the
    same turn grows from its exact ids. ``exact`` is False when the ids were re-tokenized from
    text (a server without token ids).
    """

    tokens: list[int]
    masks: list[int]
    logprobs: list[float]
    versions: list[int]
    messages: list[Message]
    finish_reason: FinishReason | None = None
    reply: str = ""
    turns: int = 0
    exact: bool = True
    prompt_length: int = field(default=0)
    reply_start: int = field(default=0)
    server_moves: list[dict[str, Any]] = field(default_factory=list)
    """Where a session moved to another inference server because its own failed
    (``{"turn", "from", "to", "reason"}`` each); empty when every turn ran on one server."""
    versions_unknown: str | None = None
    """Why the engine reported no weight version for a reply of this trajectory (a vLLM
    without its token route); None when every sampled id's version is known."""

    @classmethod
    def start(cls, prompt_ids: Sequence[int], messages: Sequence[Message]) -> Trajectory:
        n = len(prompt_ids)
        return cls(
            tokens=list(prompt_ids),
            masks=[MASK_IGNORE_INDEX] * n,
            logprobs=[PROMPT_LOGPROB] * n,
            versions=[NOT_SAMPLED_VERSION] * n,
            messages=list(messages),
            prompt_length=n,
        )

    def with_sample(
        self,
        ids: Sequence[int],
        logprobs: Sequence[float] | None,
        version: int | None,
        reason: FinishReason,
        text: str,
        token_versions: Sequence[int] | None = None,
    ) -> Trajectory:
        """This trajectory followed by one sampled reply (``logprobs`` None: not exact).

        ``token_versions`` (one per id) when the engine reported which weights sampled each
        token, else every id gets ``version``. After an aborted reply, ``ids`` continue it and
        ``text`` is the whole reply's text.
        """
        ids = list(ids)
        sampled_version = NOT_SAMPLED_VERSION if version is None else version
        if token_versions is not None and len(token_versions) != len(ids):
            raise ValueError(f"{len(token_versions)} token versions for {len(ids)} sampled ids")
        versions = (
            list(token_versions) if token_versions is not None else [sampled_version] * len(ids)
        )
        resumed = self.finish_reason == "abort"
        reply: Message = {"role": "assistant", "content": text}
        return replace(
            self,
            tokens=[*self.tokens, *ids],
            masks=[*self.masks, *ids],
            logprobs=[*self.logprobs, *(logprobs if logprobs is not None else [0.0] * len(ids))],
            versions=[*self.versions, *versions],
            messages=[*self.messages[:-1], reply] if resumed else [*self.messages, reply],
            finish_reason=reason,
            reply=text,
            turns=self.turns if resumed else self.turns + 1,
            exact=self.exact and logprobs is not None,
            reply_start=self.reply_start if resumed else len(self.tokens),
        )

    @property
    def reply_ids(self) -> list[int]:
        """The ids of the last (or aborted, still open) reply."""
        return self.tokens[self.reply_start :] if self.turns else []

    def with_context(self, ids: Sequence[int], messages: Sequence[Message]) -> Trajectory:
        """This trajectory followed by ids nobody sampled (env or tool messages)."""
        n = len(ids)
        return replace(
            self,
            tokens=[*self.tokens, *ids],
            masks=[*self.masks, *[MASK_IGNORE_INDEX] * n],
            logprobs=[*self.logprobs, *[PROMPT_LOGPROB] * n],
            versions=[*self.versions, *[NOT_SAMPLED_VERSION] * n],
            messages=[*self.messages, *messages],
        )

    @property
    def sampled_ids(self) -> list[int]:
        """Every id the engine sampled, in order (the trained positions)."""
        return [t for t, m in zip(self.tokens, self.masks, strict=True) if m != MASK_IGNORE_INDEX]

    @property
    def oldest_version(self) -> int | None:
        sampled = [v for v in self.versions if v != NOT_SAMPLED_VERSION]
        return min(sampled) if sampled else None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"
