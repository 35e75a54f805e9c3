"""Tokenize written chats into a group: for text nobody sampled (SFT rows, imported chats).

Replies sampled from a model go through :mod:`atroposlib.envs.rollouts` instead (token-in,
token-out): the ids of a sampled reply's re-tokenized text can differ from the ids the engine
sampled, and the trainer must see the latter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from atroposlib.group import ScoredData
from atroposlib.type_definitions import Message
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


def chat_group(
    tokenizer: Any,
    chats: Sequence[Sequence[Message]],
    scores: Sequence[float],
    *,
    overrides: Sequence[Mapping[str, Any]] | None = None,
    group_overrides: Mapping[str, Any] | None = None,
    train_on_all_assistant_turns: bool = False,
) -> ScoredData:
    """Tokenize each chat (only assistant turns trained) and stack them with their scores."""
    if len(chats) != len(scores):
        raise ValueError(f"{len(chats)} chats but {len(scores)} scores: give one score per chat")
    rows = [
        tokenize_for_trainer(
            tokenizer,
            list(chat),
            train_on_all_assistant_turns=train_on_all_assistant_turns,
        )
        for chat in chats
    ]
    return ScoredData.model_validate(
        {
            "tokens": [row["tokens"] for row in rows],
            "masks": [row["masks"] for row in rows],
            "scores": [float(score) for score in scores],
            "messages": [list(chat) for chat in chats],
            "overrides": [dict(o) for o in overrides] if overrides is not None else None,
            "group_overrides": dict(group_overrides) if group_overrides is not None else None,
        }
    )
