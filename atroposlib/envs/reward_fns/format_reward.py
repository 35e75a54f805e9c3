"""``format``: does the reply contain ``<tag>…</tag>`` blocks (``think``/``answer`` by default)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from atroposlib.envs.reward_fns.registry import registry
from atroposlib.envs.reward_fns.reward_function import RewardFunction


@registry.register
class FormatReward(RewardFunction):
    """1.0 when any (or, with ``require_all_tags``, every) preferred tag has a closed block.

    >>> FormatReward()(["<think>a</think> b", "<ANSWER>4</answer>", "4"])
    [1.0, 1.0, 0.0]
    >>> both = FormatReward(require_all_tags=True)
    >>> both(["<think>a</think>", "<think>a</think><answer>4</answer>"])
    [0.0, 1.0]
    """

    def __init__(
        self,
        preferred_tags: Sequence[str] | None = None,
        require_all_tags: bool = False,
        case_sensitive: bool = False,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.preferred_tags = list(preferred_tags or ["think", "answer"])
        self.require_all_tags = require_all_tags
        self.case_sensitive = case_sensitive

    def compute(self, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        flags = re.DOTALL | (0 if self.case_sensitive else re.IGNORECASE)
        patterns = [re.compile(f"<{re.escape(t)}>.*?</{re.escape(t)}>", flags)
                    for t in self.preferred_tags]  # fmt: skip
        combine = all if self.require_all_tags else any
        return [
            1.0 if combine(p.search(self.get_content(c)) for p in patterns) else 0.0
            for c in completions
        ]


def format_reward(
    completions: Sequence[Any], preferred_tags: Sequence[str] | None = None, **kwargs: Any
) -> list[float]:
    """Function form of :class:`FormatReward`."""
    return FormatReward(preferred_tags=preferred_tags).compute(completions)
