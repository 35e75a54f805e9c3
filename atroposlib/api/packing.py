"""Pure batch packing: which queued groups form the next trainer batch.

A batch is a set of whole groups whose sizes sum to exactly ``batch_size`` sequences.
``form_batch`` never stalls: whenever some subset of the queue sums to ``batch_size`` it
returns one. Every greedy choice is checked with a subset-sum reachability test (a Python-int
bitset, bounded knapsack with binary splitting over per-size counts), so the batch can
always still be completed after it.

Which groups go in is decided in two passes:

1. Reservations. An env with ``min_allocation`` and queued data gets at least
   ``floor(min_allocation * batch_size)`` sequences whenever some exact batch allows it
   (otherwise as close to it as exactness allows), taken oldest-first from its own queue.
2. Fair share. The rest is filled by start-time fair queueing: the env with the lowest
   virtual time (sequences served / weight) gives its oldest group that keeps the batch
   completable; ties go to the oldest group.

Virtual times persist in ``FairShareState``. After each batch they are shifted so the least
served backlogged env sits at 0, and envs with no queued data are lifted to at least 0, so an
idle period banks no credit.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from operator import attrgetter

logger = logging.getLogger(__name__)

EnvKey = int | None
_NONE_ENV = "none"
_size_of = attrgetter("size")


@dataclass(frozen=True, slots=True)
class QueuedGroupRef:
    """A queued group as the packer sees it: arrival key, sending env, sequence count."""

    key: int
    env_id: int | None
    size: int


@dataclass(frozen=True, slots=True)
class EnvShare:
    """How much of each batch an env is owed: a relative weight and an optional minimum."""

    weight: float = 1.0
    min_allocation: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"weight must be a finite number > 0, got {self.weight!r}")
        if self.min_allocation is not None and not 0.0 <= self.min_allocation <= 1.0:
            raise ValueError(
                f"min_allocation must be between 0 and 1 (a fraction of batch_size), "
                f"got {self.min_allocation!r}"
            )


@dataclass
class FairShareState:
    """Per-env virtual time (sequences served / weight) carried from batch to batch."""

    virtual_time: dict[int | None, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, float]:
        return {
            (_NONE_ENV if env is None else str(env)): value
            for env, value in self.virtual_time.items()
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, float]) -> FairShareState:
        virtual_time: dict[int | None, float] = {}
        for name, value in data.items():
            env = None if name == _NONE_ENV else int(name)
            number = float(value)
            if not math.isfinite(number):
                raise ValueError(f"virtual time of env {name!r} must be finite, got {value!r}")
            virtual_time[env] = number
        return cls(virtual_time=virtual_time)


_DEFAULT_SHARE = EnvShare()


def form_batch(
    queue: Sequence[QueuedGroupRef],
    batch_size: int,
    shares: Mapping[int | None, EnvShare],
    state: FairShareState,
) -> list[int] | None:
    """Keys of whole groups whose sizes sum to exactly batch_size, in FIFO (key) order, or None
    when no subset of the queue can; mutates `state` only when it returns a batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    by_env: defaultdict[EnvKey, list[QueuedGroupRef]] = defaultdict(list)
    for group in queue:
        by_env[group.env_id].append(group)
    counts = Counter(map(_size_of, queue))
    if min(counts, default=1) < 1:
        raise ValueError(f"group sizes must be >= 1, got {min(counts)}")
    for size in [size for size in counts if size > batch_size]:
        del counts[size]
    if not reach(counts, batch_size) >> batch_size & 1:
        return None
    if max(counts) < max(map(_size_of, queue)):
        by_env = _without_oversized(by_env, batch_size)
    pool = SizePool(counts, batch_size)

    packer = _Packer(by_env, batch_size, shares, state, pool)
    packer.reserve_minimums()
    packer.fill_fair_share()
    packer.commit(state)
    return sorted(packer.chosen)


def _without_oversized(
    by_env: Mapping[EnvKey, list[QueuedGroupRef]], batch_size: int
) -> defaultdict[EnvKey, list[QueuedGroupRef]]:
    """Drop groups larger than a batch (the broker rejects them at ingest; they never fit)."""
    kept: defaultdict[EnvKey, list[QueuedGroupRef]] = defaultdict(list)
    for env, groups in by_env.items():
        usable = [group for group in groups if group.size <= batch_size]
        if usable:
            kept[env] = usable
    return kept


class _Packer:
    """One batch under construction; holds the tentative virtual times until `commit`."""

    def __init__(
        self,
        by_env: Mapping[EnvKey, list[QueuedGroupRef]],
        batch_size: int,
        shares: Mapping[EnvKey, EnvShare],
        state: FairShareState,
        pool: SizePool,
    ) -> None:
        self.batch_size = batch_size
        self.remaining = batch_size
        self.pool = pool
        self.chosen: list[int] = []
        self.taken: set[int] = set()
        self.envs = list(by_env)
        self.groups = [by_env[env] for env in self.envs]
        self.shares = [shares.get(env, _DEFAULT_SHARE) for env in self.envs]
        known = [state.virtual_time[env] for env in self.envs if env in state.virtual_time]
        floor = min(known, default=0.0)
        self.vtime = [max(state.virtual_time.get(env, floor), floor) for env in self.envs]

    def _take(self, index: int, group: QueuedGroupRef) -> None:
        self.chosen.append(group.key)
        self.taken.add(group.key)
        self.remaining -= group.size
        self.pool.take(group.size)
        self.vtime[index] += group.size / self.shares[index].weight

    def reserve_minimums(self) -> None:
        """Pass 1: give each env with a minimum share its reserved sequences, oldest first."""
        wanted: list[tuple[int, int]] = []
        for index, share in enumerate(self.shares):
            if share.min_allocation:
                reserved = math.floor(share.min_allocation * self.batch_size + 1e-9)
                if reserved > 0:
                    wanted.append((index, reserved))
        if not wanted:
            return
        wanted.sort(key=lambda item: (self.vtime[item[0]], self.groups[item[0]][0].key))
        own_counts = [self._sizes(self.groups[index]) for index, _ in wanted]
        rest = Counter(self.pool.counts)
        for own in own_counts:
            rest.subtract(own)
        amounts = pick_reserved_amounts(
            target=self.remaining,
            own_reach=[reach(own, self.batch_size) for own in own_counts],
            reserved=[reserved for _, reserved in wanted],
            rest_reach=reach(+rest, self.batch_size),
            limit=self.batch_size,
        )
        for (index, reserved), own, amount in zip(wanted, own_counts, amounts, strict=True):
            if amount < reserved:
                logger.debug(
                    "env %r gets %d of its %d reserved sequences: no exact batch allows more",
                    self.envs[index],
                    amount,
                    reserved,
                )
            self._take_exactly(index, own, amount)

    def _sizes(self, groups: Iterable[QueuedGroupRef]) -> Counter[int]:
        return Counter(size for size in map(_size_of, groups) if size <= self.batch_size)

    def _take_exactly(self, index: int, own: Counter[int], amount: int) -> None:
        """Take the oldest groups of one env that sum to exactly `amount`."""
        own_pool = SizePool(own, self.batch_size)
        left = amount
        for group in self.groups[index]:
            if left == 0:
                return
            if own_pool.can_take(group.size, left):
                own_pool.take(group.size)
                left -= group.size
                self._take(index, group)

    def fill_fair_share(self) -> None:
        """Pass 2: lowest virtual time first, oldest group that keeps a batch possible."""
        dead: set[int] = set()
        cursor = [0] * len(self.envs)
        heap = [(self.vtime[i], groups[0].key, i) for i, groups in enumerate(self.groups)]
        heapq.heapify(heap)
        while self.remaining > 0 and heap:
            _, head_key, index = heapq.heappop(heap)
            groups = self.groups[index]
            position = cursor[index]
            while position < len(groups):
                group = groups[position]
                if group.key not in self.taken and group.size not in dead:
                    if self.pool.can_take(group.size, self.remaining):
                        break
                    dead.add(group.size)
                position += 1
            cursor[index] = position
            if position == len(groups):
                continue
            if group.key != head_key:
                heapq.heappush(heap, (self.vtime[index], group.key, index))
                continue
            self._take(index, group)
            cursor[index] = position + 1
            if position + 1 < len(groups):
                heapq.heappush(heap, (self.vtime[index], groups[position + 1].key, index))
        if self.remaining != 0:
            raise AssertionError(f"packing left {self.remaining} sequences unfilled; this is a bug")

    def commit(self, state: FairShareState) -> None:
        """Store the new virtual times, shifted so the least served backlogged env is at 0."""
        base = min(self.vtime)
        virtual_time = state.virtual_time
        for env, value in virtual_time.items():
            virtual_time[env] = max(value - base, 0.0)
        for env, value in zip(self.envs, self.vtime, strict=True):
            virtual_time[env] = value - base


# ---- subset-sum reachability over Python-int bitsets (bit n set: n sequences reachable)


def reach(counts: Mapping[int, int], limit: int) -> int:
    """Bitset of every sum <= limit that some sub-multiset of `counts` (size -> count) makes."""
    mask = (1 << (limit + 1)) - 1
    bits = 1
    for size, count in counts.items():
        left = min(count, limit // size)
        chunk = 1
        while left > 0:
            used = min(chunk, left)
            bits = (bits | bits << (used * size)) & mask
            left -= used
            chunk <<= 1
    return bits


@lru_cache(maxsize=4096)
def _comb(size: int, copies: int) -> int:
    """Bits at 0, size, 2*size, ..., copies*size."""
    return ((1 << ((copies + 1) * size)) - 1) // ((1 << size) - 1)


class SizePool:
    """The sizes of the groups still available, answering whether a pick keeps a batch possible.

    Counts above ``limit // size`` cannot change any sum <= limit, so caches built from the
    other sizes stay valid while a pick leaves the capped counts alone (the usual case).
    """

    def __init__(self, counts: Mapping[int, int], limit: int) -> None:
        self.limit = limit
        self.counts = {size: count for size, count in counts.items() if count > 0}
        self._others: dict[int, int] = {}

    def can_take(self, size: int, target: int) -> bool:
        """Whether `target - size` is still reachable once one group of `size` is used."""
        count = self.counts.get(size, 0)
        if size > target or count == 0:
            return False
        rest = target - size
        copies = min(count - 1, rest // size)
        if copies * size == rest:
            return True
        others = self._others.get(size)
        if others is None:
            others = reach({s: c for s, c in self.counts.items() if s != size}, self.limit)
            self._others[size] = others
        return others & (_comb(size, copies) << (rest - copies * size)) != 0

    def take(self, size: int) -> None:
        count = self.counts[size] - 1
        if count:
            self.counts[size] = count
        else:
            del self.counts[size]
        if count < self.limit // size:
            kept = self._others.get(size)
            self._others = {} if kept is None else {size: kept}


def _sumset(left: int, right: int, mask: int) -> int:
    """Bitset of a + b for every a in `left` and b in `right`, cut at `mask`."""
    if left.bit_count() > right.bit_count():
        left, right = right, left
    total = 0
    while left:
        low = left & -left
        total |= right << (low.bit_length() - 1)
        left ^= low
    return total & mask


def _reversed_bits(bits: int, width: int) -> int:
    """Bit i of the result is bit (width - 1 - i) of `bits`."""
    return int(format(bits & ((1 << width) - 1), f"0{width}b")[::-1], 2)


def pick_reserved_amounts(
    target: int, own_reach: list[int], reserved: list[int], rest_reach: int, limit: int
) -> list[int]:
    """How many sequences each reserving env contributes, in priority order.

    Each env gets the least amount >= its reservation that it can make exactly while the
    others (reserving envs after it, then `rest_reach`) can still complete `target`. When no
    exact batch honours every reservation, the lowest-priority ones are relaxed first; a
    relaxed env gets as close to its reservation as an exact batch allows.
    """
    mask = (1 << (limit + 1)) - 1
    relaxed = [False] * len(own_reach)
    while True:
        allowed = [
            own if loose else own & ~((1 << floor) - 1)
            for own, floor, loose in zip(own_reach, reserved, relaxed, strict=True)
        ]
        suffix = [rest_reach]
        for bits in reversed(allowed):
            suffix.append(_sumset(bits, suffix[-1], mask))
        suffix.reverse()
        if suffix[0] >> target & 1 or all(relaxed):
            break
        relaxed[max(i for i, loose in enumerate(relaxed) if not loose)] = True
    amounts = []
    left = target
    for i, floor in enumerate(reserved):
        feasible = allowed[i] & _reversed_bits(suffix[i + 1], left + 1)
        above = feasible >> floor
        if above:
            amount = floor + (above & -above).bit_length() - 1
        else:
            amount = (feasible & ((1 << floor) - 1)).bit_length() - 1
        amounts.append(amount)
        left -= amount
    return amounts
