"""Keeping multi-turn histories short: shrink ``<think>`` blocks, drop old turns (Atropos 0.4).

``ensure_trajectory_token_limit`` works on the steps of a game episode: each step is a group
dict with ``messages``, ``tokens``, ``masks``, ``scores``, ``seed`` and ``parsed_actions``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from atroposlib.envs.groups import ScoredDataGroup
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

__all__ = [
    "ScoredDataGroup",
    "ensure_trajectory_token_limit",
    "strip_thinking",
    "truncate_thinking",
]

logger = logging.getLogger(__name__)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TRAINED_ROLES = ("agent", "assistant")
STEP_KEYS = ("seed", "messages", "tokens", "masks", "scores", "parsed_actions")


def strip_thinking(response_text: str) -> str:
    """Remove the first ``<think>…</think>`` block.

    >>> strip_thinking("<think>long</think>Answer: 4")
    'Answer: 4'
    """
    start, end = response_text.find(THINK_OPEN), response_text.find(THINK_CLOSE)
    if start == -1 or end == -1:
        return response_text
    return response_text[:start] + response_text[end + len(THINK_CLOSE) :]


def _kept_think_tokens(tokenizer: Any, content: str, limit: int) -> tuple[list[int], bool]:
    tokens = tokenizer.encode(content, add_special_tokens=False)
    if len(tokens) <= limit:
        return tokens, False
    paragraphs = [p.strip() for p in content.split("\n\n") if p.strip()]
    if paragraphs and len(paragraphs[-1]) < len(content):
        last = tokenizer.encode(paragraphs[-1], add_special_tokens=False)
        if len(last) <= limit:
            return last, True
    return tokens[max(0, len(tokens) - limit) :], True


def truncate_thinking(response_text: str, tokenizer: Any, max_think_tokens: int) -> str:
    """Shrink the ``<think>`` block to at most ``max_think_tokens``: keep its last paragraph if
    that fits, else its last tokens, prefixed ``... ``; an empty block becomes ``<think></think>``.
    Text without a well-formed block (or that cannot be tokenized) is returned as it is.
    """
    start, end = response_text.find(THINK_OPEN), response_text.find(THINK_CLOSE)
    if start == -1 or end == -1 or start >= end:
        return response_text
    head = response_text[: start + len(THINK_OPEN)].rstrip()
    tail = response_text[end:].lstrip()
    content = response_text[start + len(THINK_OPEN) : end].strip()
    if not content:
        return head + tail
    try:
        kept, truncated = _kept_think_tokens(tokenizer, content, max_think_tokens)
        text = tokenizer.decode(kept, skip_special_tokens=True)
    except Exception:  # a tokenizer on hostile text: leave the history as it was
        logger.exception("truncate_thinking failed on %.200r", response_text)
        return response_text
    if truncated and text.strip():
        text = "... " + text.lstrip()
    text = text.strip()
    body = "" if not text or text == "..." else f"\n{text}\n"
    return f"{head}{body}{tail}"


def _turns_to_drop(messages: list[dict[str, Any]]) -> int:
    """How many messages after the first may go: a (environment, agent) pair, else one; the
    last agent reply and the observation before it always stay."""
    keep_at_end = 0
    if len(messages) > 1 and messages[-1]["role"] in TRAINED_ROLES:
        keep_at_end = 2 if len(messages) > 2 and messages[-2]["role"] == "environment" else 1
    available = len(messages) - 1 - keep_at_end
    if available <= 0:
        return 0
    pair = (
        available >= 2
        and len(messages) > 2
        and messages[1]["role"] == "environment"
        and messages[2]["role"] in TRAINED_ROLES
    )
    return 2 if pair else 1


def _shrink_step(step: dict[str, Any], tokenizer: Any, limit: int) -> dict[str, Any] | None:
    """The step with the oldest turns dropped, a round at a time, from every alternative that
    can spare them, until the longest fits ``limit``; None when it cannot be made to fit."""
    messages = [list(alternative) for alternative in step["messages"]]
    tokens, masks = step["tokens"], step["masks"]
    longest = max((len(t) for t in tokens if isinstance(t, list)), default=0)
    while longest > limit:
        spare = [_turns_to_drop(m) for m in messages]
        this_round = min((d for d in spare if d > 0), default=0)
        if this_round == 0:
            return None
        for alternative, can_drop in zip(messages, spare, strict=True):
            del alternative[1 : 1 + min(can_drop, this_round)]
        try:
            encoded = [tokenize_for_trainer(tokenizer, alternative) for alternative in messages]
        except Exception:
            logger.exception("re-tokenizing a shortened step failed; dropping the step")
            return None
        tokens = [e["tokens"] for e in encoded]
        masks = [e["masks"] for e in encoded]
        longest = max(len(t) for t in tokens)
    return {"seed": step["seed"], "messages": messages, "tokens": tokens, "masks": masks,
            "scores": step.get("scores"), "parsed_actions": step.get("parsed_actions")}  # fmt: skip


def ensure_trajectory_token_limit(
    trajectory: Sequence[dict[str, Any]], tokenizer: Any, max_trajectory_tokens: int
) -> list[dict[str, Any]]:
    """Each step whose longest alternative exceeds ``max_trajectory_tokens`` loses its oldest
    turns (the same number from every alternative that has turns to spare, system prompt kept;
    one already down to its system prompt, last observation and reply is left whole: Atropos
    0.4 cut it to the system prompt, its PR #483); steps missing data, or still too long, are
    dropped with a warning."""
    kept: list[dict[str, Any]] = []
    for index, step in enumerate(trajectory):
        if not (step.get("messages") and step.get("tokens") and step.get("masks")) or any(
            step.get(key) is None for key in ("seed", "parsed_actions")
        ):
            logger.warning("trajectory step %d lacks messages/tokens/masks/seed/parsed_actions;"
                           " dropped", index)  # fmt: skip
            continue
        longest = max((len(t) for t in step["tokens"] if isinstance(t, list)), default=0)
        if longest <= max_trajectory_tokens:
            kept.append(dict(step))
            continue
        shrunk = _shrink_step(dict(step), tokenizer, max_trajectory_tokens)
        if shrunk is None:
            logger.warning("trajectory step %d cannot be brought under %d tokens; dropped",
                           index, max_trajectory_tokens)  # fmt: skip
        else:
            kept.append(shrunk)
    return kept
