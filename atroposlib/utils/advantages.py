"""Group-relative advantage helpers for environments that set advantages themselves."""

from __future__ import annotations

import math
from collections.abc import Sequence


def group_relative_advantages(
    scores: Sequence[float], *, normalize_std: bool = True, eps: float = 1e-6
) -> list[float]:
    """GRPO advantages: ``(score - mean)``, divided by the group's std when ``normalize_std``.

    >>> [round(a, 4) for a in group_relative_advantages([1.0, 0.0, 1.0, 0.0])]
    [1.0, -1.0, 1.0, -1.0]
    >>> group_relative_advantages([2.0, 2.0])
    [0.0, 0.0]
    """
    if not scores:
        return []
    mean = sum(scores) / len(scores)
    centred = [s - mean for s in scores]
    if not normalize_std:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / len(centred))
    return [c / (std + eps) if std > eps else 0.0 for c in centred]


def token_level_advantages(
    advantages: Sequence[float], masks: Sequence[Sequence[int]]
) -> list[list[float]]:
    """Spread one advantage per sequence over its trained positions (0.0 where masked).

    >>> token_level_advantages([0.5, -0.5], [[-100, 7], [-100, -100, 9]])
    [[0.0, 0.5], [0.0, 0.0, -0.5]]
    """
    return [
        [value if m != -100 else 0.0 for m in mask]
        for value, mask in zip(advantages, masks, strict=True)
    ]


def discounted_returns(rewards: Sequence[float], gamma: float = 1.0) -> list[float]:
    """Per-step returns of a multi-step episode.

    >>> discounted_returns([0.0, 0.0, 1.0], gamma=0.5)
    [0.25, 0.5, 1.0]
    """
    out: list[float] = []
    running = 0.0
    for reward in reversed(rewards):
        running = reward + gamma * running
        out.append(running)
    return out[::-1]
