"""``crossword_format``: answers written as ``1-Across: WORD`` with letters only."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from atroposlib.envs.reward_fns.registry import registry
from atroposlib.envs.reward_fns.reward_function import RewardFunction

_ANSWER = re.compile(r"(?:Across|Down):\s+([A-Za-z]+)", re.IGNORECASE)


@registry.register
class CrosswordFormatReward(RewardFunction):
    """``reward_value`` when a format pattern matches and every answer uses ``valid_chars``.

    >>> CrosswordFormatReward()(["1-Across: CAT, 2-Down: DOG", "cat and dog"])
    [1.0, 0.0]
    """

    def __init__(
        self,
        format_patterns: Sequence[re.Pattern[str]] | None = None,
        reward_value: float = 1.0,
        penalize_invalid_chars: bool = True,
        valid_chars: str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.reward_value = reward_value
        self.penalize_invalid_chars = penalize_invalid_chars
        self.valid_chars = valid_chars.upper()
        self.format_patterns = list(format_patterns or [
            re.compile(r"\d+-(?:Across|Down):\s+[A-Z\s]+", re.IGNORECASE),
            re.compile(r"^(?:\d+-(?:Across|Down):\s+[A-Z\s]+[\s,]*)+$", re.IGNORECASE),
        ])  # fmt: skip

    def compute(self, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        return [self._score(self.get_content(c)) for c in completions]

    def _score(self, text: str) -> float:
        if not any(pattern.search(text) for pattern in self.format_patterns):
            return 0.0
        if self.penalize_invalid_chars:
            for answer in _ANSWER.findall(text):
                if any(char.upper() not in self.valid_chars for char in answer):
                    return 0.0
        return self.reward_value


def crossword_format_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """Function form of :class:`CrosswordFormatReward`."""
    return CrosswordFormatReward().compute(completions)
