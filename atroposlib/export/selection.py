"""Which sequences of a group are exported: rejection sampling (SFT) and pairing (DPO).

Pure functions over a group's scores. Ties keep the group's order, so a given input always
gives the same output. Sequences marked unusable (too long, nothing
trained) are left out silently here; the caller counts them. Every other sequence left out is
counted under a reason in ``skipped``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_TOLERANCE = 1e-9
"""Score gaps are compared with this slack, so 0.6 - 0.4 counts as a gap of 0.2."""


@dataclass(frozen=True)
class ScoreFilters:
    """The score rules shared by the SFT and DPO exporters."""

    allow_negative_scores: bool = False
    """When False, only sequences with a score above zero are kept (SFT) or chosen (DPO)."""
    minimum_score_diff: float = 0.0
    """SFT: a kept sequence scores at least this much above the group's lowest score.
    DPO: the chosen sequence scores at least this much above the rejected one."""


def _by_score(scores: Sequence[float], descending: bool) -> list[int]:
    sign = -1.0 if descending else 1.0
    return sorted(range(len(scores)), key=lambda index: (sign * scores[index], index))


def select_top_n(
    scores: Sequence[float],
    usable: Sequence[bool],
    filters: ScoreFilters,
    top_n: int,
    skipped: Counter[str],
) -> list[int]:
    """Indices of the sequences an SFT export keeps, best score first.

    >>> select_top_n([0.0, 1.0, 0.5], [True] * 3, ScoreFilters(), 2, Counter())
    [1, 2]
    >>> select_top_n([0.2, 1.0, 0.5], [True] * 3, ScoreFilters(minimum_score_diff=0.5), 3,
    ...              Counter())
    [1]
    """
    floor = min(scores) if scores else 0.0
    kept: list[int] = []
    for index in _by_score(scores, descending=True):
        score = scores[index]
        if not usable[index]:
            continue
        if not filters.allow_negative_scores and score <= 0:
            skipped["score_not_positive"] += 1
        elif score - floor < filters.minimum_score_diff - _TOLERANCE:
            skipped["below_score_gap"] += 1
        elif len(kept) >= top_n:
            skipped["beyond_top_n"] += 1
        else:
            kept.append(index)
    return kept


def pair_best_worst(
    scores: Sequence[float],
    usable: Sequence[bool],
    filters: ScoreFilters,
    n_pairs: int,
    skipped: Counter[str],
) -> list[tuple[int, int]]:
    """``(chosen, rejected)`` index pairs: the best left with the worst left, in turn.

    A pair needs the chosen score above the rejected one by at least ``minimum_score_diff``
    (and strictly above it); each sequence is used at most once.

    >>> pair_best_worst([1.0, 0.0, 0.8, 0.1], [True] * 4, ScoreFilters(0.5), 3, Counter())
    [(0, 1), (2, 3)]
    >>> pair_best_worst([1.0, 0.9], [True] * 2, ScoreFilters(minimum_score_diff=0.5), 3,
    ...                 Counter())
    []
    """
    candidates = [index for index in range(len(scores)) if usable[index]]
    worst_first = [index for index in _by_score(scores, descending=False) if usable[index]]
    used: set[int] = set()
    pairs: list[tuple[int, int]] = []
    for chosen in _by_score(scores, descending=True):
        if not usable[chosen] or chosen in used:
            continue
        if len(pairs) >= n_pairs:
            break
        if not filters.allow_negative_scores and scores[chosen] <= 0:
            break
        rejected = next(
            (
                index
                for index in worst_first
                if index not in used
                and index != chosen
                and scores[index] < scores[chosen]
                and scores[chosen] - scores[index] >= filters.minimum_score_diff - _TOLERANCE
            ),
            None,
        )
        if rejected is None:
            break
        used.update((chosen, rejected))
        pairs.append((chosen, rejected))
    skipped["unpaired"] += len(candidates) - len(used)
    return pairs
