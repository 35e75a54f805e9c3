"""Output lines of the exporters, in Atropos's formats.

SFT: ``{"prefix", "completion", "score"}``, or ``{"messages", "score"}`` with messages.
DPO: ``{"prefix", "pos", "neg", "score"}`` (``score`` is the chosen sequence's); with
messages, ``prefix`` is the list of shared leading messages and ``pos``/``neg`` the rest of
each chat.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from atroposlib.export.selection import ScoreFilters, pair_best_worst, select_top_n
from atroposlib.export.text import Decoder, split_messages, split_prompt_completion

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LineOptions:
    filters: ScoreFilters = field(default_factory=ScoreFilters)
    per_group: int = 3
    """SFT: sequences kept per group; DPO: pairs made per group."""
    save_messages: bool = False
    max_token_len: int | None = None
    """Sequences with more tokens are left out (counted as ``too_long``)."""


def _usable(
    group: dict[str, Any], options: LineOptions, decoder: Decoder | None, skipped: Counter[str]
) -> tuple[list[bool], list[Any]]:
    """Per sequence: whether it can be exported, and its content (messages or text split)."""
    usable: list[bool] = []
    content: list[Any] = []
    messages = group.get("messages")
    for index, (tokens, masks) in enumerate(zip(group["tokens"], group["masks"], strict=True)):
        item: Any = None
        if options.max_token_len is not None and len(tokens) > options.max_token_len:
            skipped["too_long"] += 1
        elif options.save_messages:
            item = messages[index] if messages and index < len(messages) else None
            if not item:
                skipped["no_messages"] += 1
        else:
            if decoder is None:
                raise ValueError("decoding tokens needs a tokenizer; pass one or save messages")
            item = split_prompt_completion(decoder, tokens, masks)
            if item is None:
                skipped["nothing_trained"] += 1
        usable.append(bool(item))
        content.append(item)
    return usable, content


def _plain_messages(chat: Any) -> list[dict[str, Any]]:
    return [dict(message) for message in chat]


def sft_lines(
    group: dict[str, Any],
    options: LineOptions,
    decoder: Decoder | None,
    skipped: Counter[str],
) -> list[dict[str, Any]]:
    """The SFT lines of one group, best score first."""
    usable, content = _usable(group, options, decoder, skipped)
    scores = group["scores"]
    lines: list[dict[str, Any]] = []
    for index in select_top_n(scores, usable, options.filters, options.per_group, skipped):
        item = content[index]
        if options.save_messages:
            lines.append({"messages": _plain_messages(item), "score": scores[index]})
        else:
            lines.append(
                {"prefix": item.prompt, "completion": item.completion, "score": scores[index]}
            )
    return lines


def dpo_lines(
    group: dict[str, Any],
    options: LineOptions,
    decoder: Decoder | None,
    skipped: Counter[str],
) -> list[dict[str, Any]]:
    """The DPO lines of one group: best with worst, then next best with next worst."""
    usable, content = _usable(group, options, decoder, skipped)
    scores = group["scores"]
    lines: list[dict[str, Any]] = []
    for chosen, rejected in pair_best_worst(
        scores, usable, options.filters, options.per_group, skipped
    ):
        pos, neg = content[chosen], content[rejected]
        if options.save_messages:
            prefix, pos_rest, neg_rest = split_messages(_plain_messages(pos), _plain_messages(neg))
            lines.append(
                {"prefix": prefix, "pos": pos_rest, "neg": neg_rest, "score": scores[chosen]}
            )
        elif pos.prompt != neg.prompt:
            skipped["prompt_mismatch"] += 2
        else:
            lines.append(
                {
                    "prefix": pos.prompt,
                    "pos": pos.completion,
                    "neg": neg.completion,
                    "score": scores[chosen],
                }
            )
    return lines
