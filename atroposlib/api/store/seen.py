"""A Bloom filter over recent group ids: "surely new" without a database query.

Nearly every posted ``group_id`` is new; asking SQLite about each one cost as much as the rest of
the store's work per POST. The filter answers "never seen" with certainty and "maybe" otherwise
(about 1 % of new ids at capacity), and only a "maybe" is checked against the store. It keeps two
generations of ``capacity`` ids each, so it always covers at least the last ``capacity`` ids added.
"""

from __future__ import annotations

_BITS_PER_ID = 10


class RecentIdFilter:
    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._size = self.capacity * _BITS_PER_ID
        self._current = bytearray((self._size + 7) // 8)
        self._previous = bytearray(len(self._current))
        self._count = 0

    def _positions(self, group_id: str) -> tuple[int, int, int, int]:
        # Four bits per id (1.2 % false "maybe" at capacity) from Python's string hash (salted
        # per process: the filter is rebuilt at every start), split in two halves for
        # Kirsch-Mitzenmacher double hashing.
        digest = hash(group_id) & 0xFFFF_FFFF_FFFF_FFFF
        first, step, size = digest & 0xFFFF_FFFF, (digest >> 32) | 1, self._size
        return (
            first % size, (first + step) % size, (first + 2 * step) % size,
            (first + 3 * step) % size,
        )  # fmt: skip

    def add(self, group_id: str) -> None:
        if self._count >= self.capacity:
            self._previous, self._current = self._current, self._previous
            self._current[:] = bytes(len(self._current))
            self._count = 0
        bits = self._current
        for position in self._positions(group_id):
            bits[position >> 3] |= 1 << (position & 7)
        self._count += 1

    def may_contain(self, group_id: str) -> bool:
        a, b, c, d = self._positions(group_id)
        return any(
            bits[a >> 3] & (1 << (a & 7))
            and bits[b >> 3] & (1 << (b & 7))
            and bits[c >> 3] & (1 << (c & 7))
            and bits[d >> 3] & (1 << (d & 7))
            for bits in (self._current, self._previous)
        )

    def clear(self) -> None:
        self._current[:] = bytes(len(self._current))
        self._previous[:] = bytes(len(self._previous))
        self._count = 0
