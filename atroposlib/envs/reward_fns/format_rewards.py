"""Format rewards: does the reply follow the ``<think>…</think><answer>…</answer>`` shape."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from atroposlib.envs.reward_fns.registry import completion_text, register_reward

_SHAPE = re.compile(r"^\s*(?:<think>(?:(?!</?think>|</?answer>).)*</think>\s*)?"
                    r"<answer>(?:(?!</?answer>|</?think>).)*</answer>\s*$", re.DOTALL)  # fmt: skip


@register_reward("answer_tag_format")
def answer_tag_format_reward(completions: Sequence[Any], **_: object) -> list[float]:
    """1.0 for exactly one ``<answer>`` block (optionally after one ``<think>`` block) and
    nothing else around them, else 0.0.

    >>> answer_tag_format_reward([
    ...     "<answer>4</answer>",
    ...     "<think>2+2</think>\\n<answer>4</answer>",
    ...     "The answer is <answer>4</answer>",
    ...     "<answer>4</answer><answer>5</answer>",
    ...     "<answer>4",
    ...     "",
    ... ])
    [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    """
    return [1.0 if _SHAPE.match(completion_text(c)) else 0.0 for c in completions]


_BLOCK = re.compile(r"<answer>(?:(?!</?answer>).)+?</answer>", re.DOTALL)


@register_reward("answer_tag_partial_format")
def answer_tag_partial_format_reward(completions: Sequence[Any], **_: object) -> list[float]:
    """Credit on the way to a reply that is ``<answer>…</answer>`` alone, for a model that never
    writes it yet: 0.25 for an ``<answer>`` tag, 0.25 for a closed block with something in it,
    and up to 0.5 for the share of the reply (stripped) that the last such block takes. The
    exact shape of ``answer_tag_format_reward`` scores 1.0, nothing else does. Measured weak
    point (benchmarks/README.md): a policy that never samples a closed block can settle on
    repeating the bare tag for its 0.25.

    >>> answer_tag_partial_format_reward([
    ...     "<answer>4</answer>",
    ...     "2 + 2 = 4, so <answer>4</answer>",
    ...     "Put it inside <answer> tags.",
    ...     "<answer>4</answer><answer>5</answer>",
    ...     "4",
    ... ])
    [1.0, 0.7812, 0.25, 0.75, 0.0]
    """
    scores = []
    for completion in completions:
        text = completion_text(completion).strip()
        if _SHAPE.match(text):
            scores.append(1.0)
            continue
        blocks = _BLOCK.findall(text)
        score = 0.25 * ("<answer>" in text) + 0.25 * bool(blocks)
        if blocks:
            score += 0.5 * len(blocks[-1]) / len(text)
        scores.append(round(score, 4))
    return scores


def answer_tag_format_credit(partial: bool) -> Callable[..., list[float]]:
    """The format reward an env with ``partial_format`` set (or not) scores replies with."""
    return answer_tag_partial_format_reward if partial else answer_tag_format_reward
