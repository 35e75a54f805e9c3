"""Held-out problems that training can never reach: a split of the problem space by hash.

A procedural task (reasoning-gym, a seeded generator) draws problems from a finite space, so
"evaluate on another seed" still evaluates on problems the trainer saw whenever the space is
small (one-digit +/- has 242 of them). Here every problem has a canonical key; a problem is
held out exactly when a salted hash of its key falls in the held-out fraction. The split does
not depend on seeds or draw order: a training stream that drops held-out keys and an eval set
that keeps only them can never meet, whatever either one draws.

``check_disjoint`` is the start-up check on the actual sets (the eval problems against every
problem the trainer can be given); an overlap raises ``HeldOutOverlapError``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from atroposlib.errors import ConfigError

Problem = TypeVar("Problem")

_SUM_OF_NATURALS = re.compile(r"^\d+(?:\+\d+)+$")


class HeldOutOverlapError(ConfigError):
    """Some evaluation problems are also in the training pool."""


class HeldOutTooSmallError(ConfigError):
    """The held-out side of the problem space has fewer distinct problems than asked for."""


def canonical_problem(question: str, metadata: Mapping[str, Any] | None = None) -> str:
    """The key that identifies a problem, whatever words or spacing pose it.

    An arithmetic ``expression`` in the metadata wins over the question text, without spaces;
    a sum of natural numbers has its terms sorted (``83 + 50`` is the fact ``50 + 83``).

    >>> canonical_problem("Calculate 83 + 50.", {"expression": "83 + 50"})
    '50+83'
    >>> canonical_problem("What is 7 - 9?", {"expression": "7 - 9"})
    '7-9'
    >>> canonical_problem("  How many  'r' in\\n'strawberry'? ")
    "how many 'r' in 'strawberry'?"
    """
    expression = (metadata or {}).get("expression")
    if isinstance(expression, str) and expression.strip():
        compact = "".join(expression.split())
        if _SUM_OF_NATURALS.match(compact):
            return "+".join(sorted(compact.split("+"), key=int))
        return compact
    return " ".join(question.split()).lower()


@dataclass(frozen=True)
class HeldOutSplit:
    """Problems whose key hashes below ``fraction`` are held out (``fraction=0``: none)."""

    fraction: float = 0.1
    salt: str = "atroposlib-held-out-v1"

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction < 1.0:
            raise ConfigError(
                f"held_out_fraction={self.fraction} must be in [0, 1): 0.1 holds out a tenth "
                "of the problem space"
            )

    def is_held_out(self, key: str) -> bool:
        """Deterministic for a key, on every machine and Python (no ``hash()`` salting)."""
        digest = hashlib.blake2b(f"{self.salt}\x00{key}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") < self.fraction * 2**64


def training_problems(
    draws: Iterable[Problem], key: Callable[[Problem], str], split: HeldOutSplit, size: int
) -> list[Problem]:
    """The first ``size`` draws that are not held out (repeats kept: it is a stream)."""
    kept: list[Problem] = []
    for problem in draws:
        if not split.is_held_out(key(problem)):
            kept.append(problem)
            if len(kept) == size:
                break
    return kept


def held_out_problems(
    draws: Iterable[Problem],
    key: Callable[[Problem], str],
    split: HeldOutSplit,
    size: int,
    exclude: Collection[str] = (),
) -> list[Problem]:
    """``size`` distinct held-out problems, in draw order; raises if the draws run out first.

    With ``fraction=0`` nothing is held out by hash and every distinct draw is taken (the
    disjointness then rests on ``check_disjoint`` alone). Keys in ``exclude`` (e.g. problems
    shown as worked examples in the prompt) are never chosen.
    """
    seen: set[str] = set(exclude)
    chosen: list[Problem] = []
    draws_read = 0
    for problem in draws:
        draws_read += 1
        name = key(problem)
        if name in seen or (split.fraction > 0 and not split.is_held_out(name)):
            continue
        seen.add(name)
        chosen.append(problem)
        if len(chosen) == size:
            return chosen
    raise HeldOutTooSmallError(
        f"only {len(chosen)} distinct held-out problems in {draws_read} draws, {size} asked: "
        "the task's problem space is too small for this eval size; make the task harder "
        "(e.g. more digits or terms), raise held_out_fraction, or lower eval_size"
    )


@dataclass(frozen=True)
class Disjointness:
    """What the start-up check found: recorded with every held-out result."""

    eval_problems: int
    training_pool: int
    overlap: int
    held_out_fraction: float

    def as_metrics(self, prefix: str = "eval/") -> dict[str, float]:
        return {
            f"{prefix}distinct_problems": float(self.eval_problems),
            f"{prefix}training_pool_problems": float(self.training_pool),
            f"{prefix}overlap_with_training_pool": float(self.overlap),
        }


def check_disjoint(
    eval_keys: Sequence[str], training_keys: Iterable[str], held_out_fraction: float
) -> Disjointness:
    """Count eval keys found in the training pool; any at all raises ``HeldOutOverlapError``."""
    pool = set(training_keys)
    distinct = set(eval_keys)
    shared = sorted(distinct & pool)
    if shared:
        examples = ", ".join(repr(k) for k in shared[:3])
        raise HeldOutOverlapError(
            f"{len(shared)} of {len(distinct)} evaluation problems are in the training pool "
            f"(e.g. {examples}): a held-out score would measure memory, not learning; set "
            "held_out_fraction > 0 so that training and evaluation draw from disjoint slices"
        )
    return Disjointness(len(distinct), len(pool), 0, held_out_fraction)
