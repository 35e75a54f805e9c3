"""Format rewards: does the reply follow the ``<think>…</think><answer>…</answer>`` shape."""

from __future__ import annotations

import re
from collections.abc import Sequence
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
