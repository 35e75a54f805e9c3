"""How sure a held-out accuracy change is: percentile bootstrap intervals over problems.

Every figure here is a mean over the same held-out problems, one value per problem (a gain is
``after - before`` of that problem: -1, 0 or +1; a difference between two systems is the
difference of their gains on that problem). Resampling the problems with replacement and
taking the middle ``confidence`` share of the resampled means gives the interval; a seeded
generator makes it the same on every run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    estimate: float
    """The mean over the problems themselves."""
    low: float
    high: float
    confidence: float

    def __str__(self) -> str:
        return (
            f"{100 * self.estimate:+.1f} pts "
            f"[{100 * self.low:+.1f}, {100 * self.high:+.1f}] ({100 * self.confidence:.0f} %)"
        )


def bootstrap_mean(
    values: Sequence[float], confidence: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> Interval:
    """Percentile bootstrap interval of the mean of ``values``.

    >>> bootstrap_mean([1.0] * 10)
    Interval(estimate=1.0, low=1.0, high=1.0, confidence=0.95)
    """
    if not values:
        raise ValueError("no values: a bootstrap interval needs at least one problem")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence} must be between 0 and 1, e.g. 0.95")
    data = np.asarray(values, dtype=np.float64)  # (N,)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for start in range(0, resamples, 1_000):  # bounded memory: (1000, N) indices at a time
        count = min(1_000, resamples - start)
        picks = rng.integers(0, len(data), size=(count, len(data)))
        means[start : start + count] = data[picks].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return Interval(float(data.mean()), float(low), float(high), confidence)


def gains(before: Sequence[bool], after: Sequence[bool]) -> list[float]:
    """Per-problem change, ``after - before`` (-1, 0 or +1), the two lists in the same order.

    >>> gains([True, False, False], [True, True, False])
    [0.0, 1.0, 0.0]
    """
    if len(before) != len(after):
        raise ValueError(f"{len(before)} results before but {len(after)} after: same problems")
    return [float(b) - float(a) for a, b in zip(before, after, strict=True)]


def gain_difference(
    before: Sequence[bool], ours: Sequence[bool], theirs: Sequence[bool]
) -> list[float]:
    """Per-problem difference of two systems' gains from the same ``before``.

    >>> gain_difference([False, False], [True, False], [False, True])
    [1.0, -1.0]
    """
    return [a - b for a, b in zip(gains(before, ours), gains(before, theirs), strict=True)]
