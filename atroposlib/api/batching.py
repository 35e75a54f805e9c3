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
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from operator import attrgetter

__all__ = ["EnvShare", "FairShareState", "QueuedGroupRef", "form_batch"]

logger = logging.getLogger(__name__)

EnvKey = int | None
_NONE_ENV = "none"
_size_of = attrgetter("size")
_env_of = attrgetter("env_id")
_SKIPS_BEFORE_INDEXING = 256


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
    if not queue:
        return None
    # Columns built at C speed; everything after touches only the groups it considers.
    sizes = list(map(_size_of, queue))
    distinct = set(sizes)
    if min(distinct) < 1:
        raise ValueError(f"group sizes must be >= 1, got {min(distinct)}")
    counts = {
        size: _count_up_to(sizes, size, 2 * (batch_size // size))
        for size in distinct
        if size <= batch_size
    }
    if not reach(counts, batch_size) >> batch_size & 1:
        return None
    packer = _Packer(queue, sizes, batch_size, shares, state, SizePool(counts, batch_size))
    packer.reserve_minimums()
    packer.fill_fair_share()
    packer.commit(state, oversized=max(distinct) > batch_size)
    return sorted(queue[position].key for position in packer.chosen)


def _count_up_to(items: list[int], value: int, cap: int) -> int:
    """How many times `value` occurs in `items`, counting no further than `cap`."""
    if cap > 1024:
        return min(items.count(value), cap)
    found = 0
    position = -1
    while found < cap:
        try:
            position = items.index(value, position + 1)
        except ValueError:  # no further occurrence
            return found
        found += 1
    return found


class _Packer:
    """One batch under construction; holds the tentative virtual times until `commit`.

    Groups are addressed by their position in the queue; each env walks its own groups with
    ``list.index`` over the env column, so no per-env list of the whole queue is built.
    """

    def __init__(
        self,
        queue: Sequence[QueuedGroupRef],
        sizes: list[int],
        batch_size: int,
        shares: Mapping[EnvKey, EnvShare],
        state: FairShareState,
        pool: SizePool,
    ) -> None:
        self.queue = queue
        self.sizes = sizes
        self.env_column = list(map(_env_of, queue))
        self.batch_size = batch_size
        self.remaining = batch_size
        self.pool = pool
        self.chosen: list[int] = []
        self.taken: set[int] = set()
        heads = {env: self.env_column.index(env) for env in set(self.env_column)}
        self.envs = sorted(heads, key=heads.__getitem__)
        self.heads = [heads[env] for env in self.envs]
        self.shares = [shares.get(env, _DEFAULT_SHARE) for env in self.envs]
        known = [state.virtual_time[env] for env in self.envs if env in state.virtual_time]
        floor = min(known, default=0.0)
        self.vtime = [max(state.virtual_time.get(env, floor), floor) for env in self.envs]
        self._cursor = list(self.heads)
        self._dead: set[int] = set()  # sizes that can no longer go in this batch
        self._skipped = 0
        # Built only after many skipped groups: the (env, size) pairs still ahead, so an env
        # left with nothing but dead sizes is dropped without walking the rest of its queue.
        self._ahead: set[tuple[EnvKey, int]] | None = None

    def _next(self, index: int, position: int) -> int:
        """Position of env `index`'s first group at or after `position`, or len(queue)."""
        try:
            return self.env_column.index(self.envs[index], position)
        except ValueError:
            return len(self.env_column)

    def _positions(self, index: int, budget: int | None) -> list[int]:
        """Env `index`'s groups, oldest first; with a budget, only until they hold that many
        sequences (an env's oldest groups are the ones a reservation takes)."""
        positions = []
        held = 0
        position = self.heads[index]
        while position < len(self.env_column) and (budget is None or held < budget):
            if self.sizes[position] <= self.batch_size:
                positions.append(position)
                held += self.sizes[position]
            position = self._next(index, position + 1)
        return positions

    def _take(self, index: int, position: int) -> None:
        size = self.sizes[position]
        self.chosen.append(position)
        self.taken.add(position)
        self.remaining -= size
        self.pool.take(size)
        self.vtime[index] += size / self.shares[index].weight

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
        wanted.sort(key=lambda item: (self.vtime[item[0]], self.heads[item[0]]))
        floors = [floor for _, floor in wanted]
        # Usually the oldest 2 * batch_size sequences of each env settle it; only when some
        # reservation cannot be met that way is every group of those envs considered.
        budget = 2 * self.batch_size
        for attempt in (budget, None):
            own_positions = [self._positions(index, attempt) for index, _ in wanted]
            own_counts = [Counter(map(self.sizes.__getitem__, p)) for p in own_positions]
            amounts = pick_reserved_amounts(
                target=self.remaining,
                own_reach=[reach(own, self.batch_size) for own in own_counts],
                reserved=floors,
                rest_reach=reach(self._rest_counts(own_counts), self.batch_size),
                limit=self.batch_size,
            )
            held = [sum(map(self.sizes.__getitem__, p)) for p in own_positions]
            if all(map(int.__ge__, amounts, floors)) or max(held) < budget:
                break
        for (index, reserved), positions, own, amount in zip(
            wanted, own_positions, own_counts, amounts, strict=True
        ):
            if amount < reserved:
                logger.debug(
                    "env %r gets %d of its %d reserved sequences: no exact batch allows more",
                    self.envs[index],
                    amount,
                    reserved,
                )
            self._take_exactly(index, positions, own, amount)

    def _rest_counts(self, own_counts: list[Counter[int]]) -> dict[int, int]:
        """Capped size counts of the pool without the given groups."""
        rest = {}
        for size, count in self.pool.counts.items():
            cap = self.batch_size // size
            owned = sum(own[size] for own in own_counts)
            if count >= 2 * cap and count - owned < cap:  # the pool stopped counting at 2 * cap
                count = _count_up_to(self.sizes, size, cap + owned)
            rest[size] = min(count - owned, cap)
        return rest

    def _take_exactly(
        self, index: int, positions: list[int], own: Counter[int], amount: int
    ) -> None:
        """Take the oldest groups of one env that sum to exactly `amount`."""
        own_pool = SizePool(own, self.batch_size)
        left = amount
        for position in positions:
            if left == 0:
                return
            size = self.sizes[position]
            if own_pool.can_take(size, left):
                own_pool.take(size)
                left -= size
                self._take(index, position)
        if left != 0:
            raise AssertionError(f"reservation left {left} sequences unfilled; this is a bug")

    def fill_fair_share(self) -> None:
        """Pass 2: lowest virtual time first, oldest group that keeps a batch possible."""
        end = len(self.env_column)
        heap = [(self.vtime[i], head, i) for i, head in enumerate(self.heads)]
        heapq.heapify(heap)
        while self.remaining > 0 and heap:
            _, head, index = heapq.heappop(heap)
            position = self._usable(index)
            if position == end:
                continue
            if position != head:  # skipped groups that can no longer go in: re-queue the env
                heapq.heappush(heap, (self.vtime[index], position, index))
                continue
            self._take(index, position)
            position = self._cursor[index] = self._next(index, position + 1)
            if position < end:
                heapq.heappush(heap, (self.vtime[index], position, index))
        if self.remaining != 0:
            raise AssertionError(f"packing left {self.remaining} sequences unfilled; this is a bug")

    def _usable(self, index: int) -> int:
        """Env `index`'s oldest group that can still go in the batch, or len(queue) if none.

        A size that cannot complete the batch now never can later in it (the target only
        shrinks by picks from the same pool), so skipped groups stay skipped.
        """
        end = len(self.env_column)
        position = self._cursor[index]
        while position < end:
            if self._ahead is not None and self._exhausted(index, self._ahead):
                position = end
                break
            size = self.sizes[position]
            if position not in self.taken and size not in self._dead:
                if self.pool.can_take(size, self.remaining):
                    break
                self._dead.add(size)
            self._skipped += 1
            if self._ahead is None and self._skipped > _SKIPS_BEFORE_INDEXING:
                start = min(self._cursor)
                self._ahead = set(zip(self.env_column[start:], self.sizes[start:], strict=True))
            position = self._next(index, position + 1)
        self._cursor[index] = position
        return position

    def _exhausted(self, index: int, ahead: set[tuple[EnvKey, int]]) -> bool:
        """Whether no size that could still go in the batch is among env `index`'s groups."""
        env = self.envs[index]
        return not any(
            (env, size) in ahead
            for size in self.pool.counts
            if size <= self.remaining and size not in self._dead
        )

    def commit(self, state: FairShareState, oversized: bool) -> None:
        """Store the new virtual times, shifted so the least served backlogged env is at 0.

        Envs without queued data are lifted to at least 0, so idling banks no credit.
        """
        backlogged = self.vtime
        if oversized:  # an env holding only groups larger than a batch is not backlogged
            usable = {
                env
                for env, size in zip(self.env_column, self.sizes, strict=True)
                if size <= self.batch_size
            }
            backlogged = [v for env, v in zip(self.envs, self.vtime, strict=True) if env in usable]
        base = min(backlogged)
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
    other sizes stay valid while a pick leaves the capped counts alone. Counting each size up
    to twice its cap makes that the usual case: one batch takes at most the cap.
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


def _runs(bits: int) -> int:
    """How many maximal blocks of consecutive set bits `bits` has."""
    return (bits & ~(bits << 1)).bit_count()


def _sumset(left: int, right: int, mask: int) -> int:
    """Bitset of a + b for every a in `left` and b in `right`, cut at `mask`.

    Walks the operand with fewer blocks of consecutive bits; a block of length n adds
    `right` smeared over n positions, which takes log2(n) shifts.
    """
    if _runs(left) > _runs(right):
        left, right = right, left
    total = 0
    while left:
        low = left & -left
        start = low.bit_length() - 1
        rest = (left + low) & left
        length = (left ^ rest).bit_length() - start
        smeared, covered = right, 1
        while covered < length:
            step = min(covered, length - covered)
            smeared |= smeared << step
            covered += step
        total |= smeared << start
        left = rest
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
