"""Problems chosen by what they can still teach: revisit those whose last group taught, skip
the kinds the model always or never solves.

A problem whose group's scores differed is one the model sometimes solves: the likeliest to
teach again. :class:`RevisitPool` keeps those problems and hands them back for another group,
the one waiting longest first, until a group of theirs scores all-equal (the model has learned
or lost them) or they have had ``max_groups``.

A GRPO group whose replies all score the same teaches nothing (the env drops it when
``ensure_scores_are_not_same`` is on), yet its sampling costs as much as a group that teaches.
:class:`SignalSelector` keeps, per kind of problem (a problem itself when problems come back,
else a bucket of like problems: a task, a difficulty), the share of its recent groups whose
scores differed, and admits a problem of that kind with a probability proportional to that
share against the best kind's. A kind never seen, or seen fewer than ``min_groups`` times, is
always admitted; a kind that has stopped teaching is still admitted at ``floor``, so a change
in the model (a kind it starts or stops solving) is noticed.

    selector = SignalSelector(random.Random(0))
    while not selector.admit(kind_of(item)):
        item = next_problem()
    ...
    selector.record(kind_of(item), scores)
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SignalSelector:
    """Admits problems by the recent share of their kind's groups with differing scores."""

    rng: random.Random
    window: int = 32
    """Groups of a kind remembered (the oldest forgotten first): how fast a change shows."""
    min_groups: int = 8
    """Groups of a kind seen before its share counts; until then it is always admitted."""
    floor: float = 0.1
    """The least admission probability of a kind whose groups have stopped teaching."""
    _signal: dict[str, deque[bool]] = field(default_factory=dict)
    _scores: dict[str, deque[float]] = field(default_factory=dict)
    admitted: int = 0
    skipped: int = 0

    def __post_init__(self) -> None:
        if self.window < 1 or not 1 <= self.min_groups <= self.window:
            raise ValueError(
                f"window {self.window} and min_groups {self.min_groups}: need "
                "1 <= min_groups <= window"
            )
        if not 0 < self.floor <= 1:
            raise ValueError(f"floor {self.floor}: give a probability in (0, 1]")

    def record(self, kind: str, scores: Sequence[float]) -> None:
        """A group of ``kind`` was scored (whether or not it was then sent)."""
        if not scores:
            return
        self._signal.setdefault(kind, deque(maxlen=self.window)).append(max(scores) != min(scores))
        self._scores.setdefault(kind, deque(maxlen=self.window * 8)).extend(scores)

    def signal_share(self, kind: str) -> float | None:
        """The share of the kind's recent groups whose scores differed (None: too few yet)."""
        recent = self._signal.get(kind)
        if recent is None or len(recent) < self.min_groups:
            return None
        return sum(recent) / len(recent)

    def admission(self, kind: str) -> float:
        """The probability that a problem of ``kind`` is sampled now."""
        share = self.signal_share(kind)
        if share is None:
            return 1.0
        known = (self.signal_share(k) for k in self._signal)
        best = max((s for s in known if s is not None), default=0.0)
        if best <= 0:
            return 1.0  # no kind teaches: skipping would only cost the draws
        return max(self.floor, share / best)

    def admit(self, kind: str) -> bool:
        """Whether to sample a problem of ``kind`` now (counted in ``admitted`` / ``skipped``)."""
        admitted = self.rng.random() < self.admission(kind)
        if admitted:
            self.admitted += 1
        else:
            self.skipped += 1
        return admitted

    def summary(self) -> dict[str, dict[str, float | int | None]]:
        """Per kind: groups remembered, their signal share, mean score, admission probability."""
        return {
            kind: {
                "groups": len(recent),
                "signal_share": self.signal_share(kind),
                "mean_score": sum(self._scores[kind]) / len(self._scores[kind]),
                "admission": self.admission(kind),
            }
            for kind, recent in sorted(self._signal.items())
        }


@dataclass
class RevisitPool:
    """Problems whose last group taught something, handed back for another group."""

    rng: random.Random
    share: float
    """The probability that a draw revisits a problem (when one is waiting)."""
    max_groups: int = 4
    """Groups a problem may have in all, its first included."""
    _waiting: OrderedDict[Hashable, tuple[Any, int]] = field(default_factory=OrderedDict)
    _out: dict[Hashable, int] = field(default_factory=dict)
    """Problems drawn again and not yet recorded: their groups so far."""
    revisits: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.share <= 1:
            raise ValueError(f"revisit share {self.share}: give a probability in [0, 1]")
        if self.max_groups < 1:
            raise ValueError(f"max_groups {self.max_groups}: a problem has at least its first")

    def record(self, key: Hashable, item: Any, scores: Sequence[float]) -> None:
        """A group of problem ``key`` was scored: it waits for another if its scores differed
        and it has groups left, else it leaves the pool."""
        groups = self._out.pop(key, 0) + 1
        self._waiting.pop(key, None)
        if scores and max(scores) != min(scores) and groups < self.max_groups:
            self._waiting[key] = (item, groups)

    def draw(self) -> Any | None:
        """A waiting problem (the longest waiting), with probability ``share``, else None."""
        if not self._waiting or self.rng.random() >= self.share:
            return None
        key, (item, groups) = self._waiting.popitem(last=False)
        self._out[key] = groups
        self.revisits += 1
        return item

    def __len__(self) -> int:
        return len(self._waiting)
