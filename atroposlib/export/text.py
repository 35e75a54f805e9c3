"""Turning a scored sequence into text: prompt (masked part) and completion (trained part).

The split follows the masks, not string matching: the prompt is every token before the first
trained position (mask != -100), the completion runs from the first to the last trained
position. Masked spans inside the completion (tool output in a multi-turn rollout) stay in
the completion text so it reads as it was generated. Special tokens are kept, so chat-template
markers survive into the exported text.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from atroposlib.group import MASK_IGNORE_INDEX

logger = logging.getLogger(__name__)


class Decoder(Protocol):
    """The part of a Hugging Face tokenizer the exporters use."""

    def decode(self, token_ids: list[int], **kwargs: Any) -> str: ...


@dataclass(frozen=True)
class PromptCompletion:
    prompt: str
    completion: str


def trained_span(masks: Sequence[int]) -> tuple[int, int] | None:
    """``(first, last + 1)`` of the trained positions, or None when nothing is trained.

    >>> trained_span([-100, -100, 5, 6, -100])
    (2, 4)
    >>> trained_span([-100, -100]) is None
    True
    """
    trained = [index for index, mask in enumerate(masks) if mask != MASK_IGNORE_INDEX]
    if not trained:
        return None
    return trained[0], trained[-1] + 1


def split_prompt_completion(
    decoder: Decoder, tokens: Sequence[int], masks: Sequence[int]
) -> PromptCompletion | None:
    """Decode one sequence as (prompt, completion); None when no position is trained."""
    span = trained_span(masks)
    if span is None:
        return None
    start, end = span
    return PromptCompletion(
        prompt=decoder.decode(list(tokens[:start])),
        completion=decoder.decode(list(tokens[start:end])),
    )


def split_messages(
    chosen: Sequence[dict[str, Any]], rejected: Sequence[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Split two chats into their shared leading messages and what follows in each.

    >>> split_messages([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    ...                [{"role": "user", "content": "q"}, {"role": "assistant", "content": "b"}])
    ([{'role': 'user', 'content': 'q'}], [{'role': 'assistant', 'content': 'a'}], \
[{'role': 'assistant', 'content': 'b'}])
    """
    shared = 0
    limit = min(len(chosen), len(rejected)) - 1
    while shared < limit and chosen[shared] == rejected[shared]:
        shared += 1
    return list(chosen[:shared]), list(chosen[shared:]), list(rejected[shared:])
