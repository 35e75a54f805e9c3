"""Pick the best of a group of alternatives by a primary score, ties broken by a secondary."""

from __future__ import annotations

from collections.abc import Sequence


def select_best_index(
    primary_scores: Sequence[float],
    secondary_scores: Sequence[float],
    primary_higher_is_better: bool = True,
    secondary_lower_is_better: bool = True,
) -> int:
    """Index of the best item; among equal primary scores the better secondary wins, and among
    full ties the earliest.

    >>> select_best_index([1.0, 2.0, 2.0], [5, 9, 3])
    2
    >>> select_best_index([1, 1], [3, 4], secondary_lower_is_better=False)
    1
    """
    if not primary_scores or not secondary_scores:
        raise ValueError("Input score lists cannot be empty.")
    if len(primary_scores) != len(secondary_scores):
        raise ValueError("Primary and secondary score lists must have the same length.")
    primary_sign = 1 if primary_higher_is_better else -1
    secondary_sign = -1 if secondary_lower_is_better else 1
    best = 0
    for index in range(1, len(primary_scores)):
        gain = primary_sign * (primary_scores[index] - primary_scores[best])
        if gain > 0 or (
            gain == 0 and secondary_sign * (secondary_scores[index] - secondary_scores[best]) > 0
        ):
            best = index
    return best
