"""Sample a group of replies to one prompt and stack the scored chats into a ``ScoredDataGroup``.

Most single-turn environments are the same three steps: ask the server for ``n`` replies to a
prompt, score the replies, tokenize ``prompt + reply`` for the trainer. ``sample_group`` does
all three; ``sample_replies`` and ``chat_group`` are the steps for an env that needs to do
something in between (async scoring, per-reply overrides, multi-turn chats).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from openai.types.chat import ChatCompletion

from atroposlib.envs.groups import ScoredDataGroup
from atroposlib.type_definitions import Message
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

ScoreReplies = Callable[[list[str]], Sequence[float] | Awaitable[Sequence[float]]]
"""Scores for a list of replies, one each, in order (a plain or an async function)."""


class ChatServer(Protocol):
    """What sampling needs of a server: the ``ServerManager``'s ``chat_completion``."""

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion: ...


@dataclass(frozen=True)
class Replies:
    """The replies sampled for one prompt and why each one stopped (``"stop"``, ``"length"``)."""

    prompt: list[Message]
    texts: list[str]
    finish_reasons: list[str]

    def chats(self) -> list[list[Message]]:
        """``prompt + [assistant reply]`` for each reply."""
        return [[*self.prompt, {"role": "assistant", "content": text}] for text in self.texts]


async def sample_replies(
    server: ChatServer,
    prompt: Sequence[Message],
    *,
    n: int,
    max_tokens: int,
    temperature: float | None = None,
    split: str | None = None,
) -> Replies:
    """``n`` replies to ``prompt``; ``temperature=None`` leaves the server's default,
    ``split="eval"`` draws on the server's evaluation capacity."""
    sampling: dict[str, Any] = {"n": n, "max_tokens": max_tokens}
    if temperature is not None:
        sampling["temperature"] = temperature
    if split is not None:
        sampling["split"] = split
    completion = await server.chat_completion(messages=list(prompt), **sampling)
    return Replies(
        prompt=list(prompt),
        texts=[choice.message.content or "" for choice in completion.choices],
        finish_reasons=[choice.finish_reason or "" for choice in completion.choices],
    )


async def greedy_reply(server: ChatServer, prompt: Sequence[Message], *, max_tokens: int) -> str:
    """One greedy (``temperature=0``) reply for evaluation, on the server's eval capacity."""
    replies = await sample_replies(
        server, prompt, n=1, max_tokens=max_tokens, temperature=0.0, split="eval"
    )
    return replies.texts[0]


async def sample_group(
    server: ChatServer,
    tokenizer: Any,
    prompt: Sequence[Message],
    score: ScoreReplies,
    *,
    n: int,
    max_tokens: int,
    temperature: float | None = None,
) -> ScoredDataGroup:
    """Sample ``n`` replies to ``prompt``, score them with ``score``, tokenize each chat."""
    replies = await sample_replies(
        server, prompt, n=n, max_tokens=max_tokens, temperature=temperature
    )
    scores = score(replies.texts)
    if inspect.isawaitable(scores):
        scores = await scores
    return chat_group(tokenizer, replies.chats(), scores, finish_reasons=replies.finish_reasons)


def chat_group(
    tokenizer: Any,
    chats: Sequence[Sequence[Message]],
    scores: Sequence[float],
    *,
    finish_reasons: Sequence[str] | None = None,
    overrides: Sequence[dict[str, Any]] | None = None,
    group_overrides: dict[str, Any] | None = None,
    train_on_all_assistant_turns: bool = False,
) -> ScoredDataGroup:
    """Tokenize each chat (only assistant turns trained) and stack them with their scores."""
    if len(chats) != len(scores):
        raise ValueError(f"{len(chats)} chats but {len(scores)} scores: give one score per chat")
    messages: list[list[Message]] = []
    group: ScoredDataGroup = {"tokens": [], "masks": [], "scores": [], "messages": messages}
    for index, (chat, score) in enumerate(zip(chats, scores, strict=True)):
        out = tokenize_for_trainer(
            tokenizer,
            list(chat),
            include_messages=True,
            train_on_all_assistant_turns=train_on_all_assistant_turns,
            finish_reason=finish_reasons[index] if finish_reasons else "",
        )
        group["tokens"].append(out["tokens"])
        group["masks"].append(out["masks"])
        group["scores"].append(float(score))
        messages.append(out["messages"])
    if overrides is not None:
        group["overrides"] = [dict(o) for o in overrides]
    if group_overrides is not None:
        group["group_overrides"] = dict(group_overrides)
    return group
