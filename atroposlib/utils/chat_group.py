"""Build a ``ScoredDataGroup`` from finished chats and their scores (the loop every env writes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from atroposlib.envs.groups import ScoredDataGroup
from atroposlib.type_definitions import Message
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


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
