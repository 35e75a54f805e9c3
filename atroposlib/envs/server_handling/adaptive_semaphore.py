"""A request semaphore whose usable share of its slots follows the env's inference weight."""

from __future__ import annotations

import asyncio
import math
from collections import deque
from types import TracebackType
from typing import Literal

__all__ = ["AsyncSemWithAdaptiveWeight"]


class AsyncSemWithAdaptiveWeight(asyncio.Semaphore):
    """``max_val`` request slots, of which ``capacity = max(1, floor(max_val * weight))`` may be
    held at once; the rest are held back (``min_val()``) while the weight is below 1. An
    ``asyncio.Semaphore`` (as in Atropos), with its own admission rules.

    The broker tells each env its share of inference (``env_weight``); lowering the weight
    lets requests already in flight finish and admits new ones only as slots drop below the
    new capacity. Waiters are served first come, first served; a slot freed while someone
    waits goes straight to them. Atropos's name and attributes (``max_val``, ``weight``,
    ``_value``: slots not held; ``min_val()``, ``update_weight()``); usable with ``async with``.

    >>> sem = AsyncSemWithAdaptiveWeight(4)
    >>> sem.update_weight(0.5); sem.capacity, sem.free, sem.min_val()
    (2, 2, 2)
    """

    def __init__(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"a request semaphore needs at least one slot, got {value}")
        super().__init__(value)
        self.max_val = value
        self.weight = 1.0
        self._value = value
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def capacity(self) -> int:
        """Slots that may be held at once at the current weight (never below one)."""
        return max(1, min(self.max_val, math.floor(self.max_val * self.weight + 1e-9)))

    def min_val(self) -> int:
        """Slots held back by the weight: ``_value`` never goes below this."""
        return self.max_val - self.capacity

    @property
    def free(self) -> int:
        """Slots a new request could take now (negative after the weight was lowered)."""
        return self._value - self.min_val()

    def update_weight(self, weight: float) -> None:
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"weight must be a finite number > 0, got {weight!r}")
        self.weight = weight
        self._hand_over()

    def locked(self) -> bool:
        """Whether ``acquire()`` would wait: no free slot, or others are waiting already."""
        return self.free <= 0 or bool(self._waiters)

    async def acquire(self) -> Literal[True]:
        if not self.locked():
            self._value -= 1
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed over just as we were cancelled
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise
        return True

    def release(self) -> None:
        if self._value >= self.max_val:
            raise ValueError("released more often than acquired")
        self._value += 1
        self._hand_over()

    def _hand_over(self) -> None:
        """Give free slots to waiters, oldest first (the slot is taken on their behalf)."""
        while self._waiters and self.free > 0:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._value -= 1
                waiter.set_result(None)

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
