"""``reasoning_steps``: how much step-by-step structure a reply shows (0.0 to 1.0)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from atroposlib.envs.reward_fns.registry import registry
from atroposlib.envs.reward_fns.reward_function import RewardFunction

STEP_PATTERNS: dict[str, str] = {
    "numbered_steps": r"Step\s+\d+[\s:]+",
    "list_numbers": r"(?:^|\n)\s*\d+\.\s+",
    "bullet_points": r"(?:^|\n)\s*[\-\*•]\s+",
    "transition_words": r"\b(?:First|Second|Third|Fourth|Fifth|Next|Then|Finally|"
    r"Subsequently|Afterward|Lastly|Initially|To begin|Let\'s begin|I\'ll first|After that|"
    r"In conclusion|Eventually|To solve|begin by|understand|analyze|apply|compute)\b",
}
DEFAULT_PATTERN_WEIGHTS = {
    "numbered_steps": 0.5, "list_numbers": 0.5, "bullet_points": 0.4, "transition_words": 0.3,
}  # fmt: skip


@registry.register
class ReasoningStepsReward(RewardFunction):
    """Sum over pattern kinds of ``min(1, matches / min_steps) * weight``, plus ``base_score``
    for more than ``min_words`` words, capped at 1.0.

    >>> ReasoningStepsReward()(["Step 1: add. Step 2: carry. Step 3: done.", "4"])
    [0.5, 0.0]
    """

    def __init__(
        self,
        min_words: int = 10,
        min_steps: int = 3,
        base_score: float = 0.1,
        pattern_weights: dict[str, float] | None = None,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.min_words = min_words
        self.min_steps = min_steps
        self.base_score = base_score
        self.pattern_weights = {**DEFAULT_PATTERN_WEIGHTS, **(pattern_weights or {})}
        self.patterns = dict(STEP_PATTERNS)

    def compute(self, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        return [self._score(self.get_content(c)) for c in completions]

    def _score(self, text: str) -> float:
        score = 0.0
        for kind, pattern in self.patterns.items():
            found = len(re.findall(pattern, text, re.IGNORECASE | re.MULTILINE))
            score += min(1.0, found / self.min_steps) * self.pattern_weights.get(kind, 0.3)
        if len(text.split()) > self.min_words:
            score += self.base_score
        return round(min(1.0, score), 10)


def reasoning_steps_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """Function form of :class:`ReasoningStepsReward`."""
    return ReasoningStepsReward().compute(completions)
