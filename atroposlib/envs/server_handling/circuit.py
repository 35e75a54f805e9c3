"""A circuit breaker per inference server: failing servers leave the rotation and come back."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from enum import Enum

logger = logging.getLogger(__name__)


class CircuitState(Enum):
    CLOSED = "closed"
    """Healthy: requests flow."""
    OPEN = "open"
    """Failing: no requests until ``reset_after_s`` has passed."""
    HALF_OPEN = "half_open"
    """On probation: one trial request decides between CLOSED and OPEN."""


class CircuitBreaker:
    """Opens after ``failure_threshold`` consecutive failures; one trial request after the cooldown.

    >>> clock = [0.0]
    >>> breaker = CircuitBreaker("s0", failure_threshold=2, reset_after_s=5, clock=lambda: clock[0])
    >>> breaker.record_failure(); breaker.record_failure(); breaker.state
    <CircuitState.OPEN: 'open'>
    >>> breaker.allows_request()
    False
    >>> clock[0] = 6.0; breaker.allows_request(), breaker.state
    (True, <CircuitState.HALF_OPEN: 'half_open'>)
    >>> breaker.record_success(); breaker.state
    <CircuitState.CLOSED: 'closed'>
    """

    def __init__(
        self,
        name: str,
        *,
        failure_threshold: int = 3,
        reset_after_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.failure_threshold = max(1, failure_threshold)
        self.reset_after_s = reset_after_s
        self._clock = clock
        self.state = CircuitState.CLOSED
        self.consecutive_failures = 0
        self.opened_at = 0.0
        self.trial_in_flight = False
        self.times_opened = 0

    def allows_request(self) -> bool:
        """Whether a request may be sent now (moves OPEN to HALF_OPEN after the cooldown)."""
        if self.state is CircuitState.CLOSED:
            return True
        if self.state is CircuitState.OPEN:
            if self._clock() - self.opened_at < self.reset_after_s:
                return False
            self.state = CircuitState.HALF_OPEN
            self.trial_in_flight = False
            logger.info("inference server %s: trying it again", self.name)
        return not self.trial_in_flight

    def seconds_until_retry(self) -> float:
        if self.state is not CircuitState.OPEN:
            return 0.0
        return max(0.0, self.reset_after_s - (self._clock() - self.opened_at))

    def on_request_start(self) -> None:
        if self.state is CircuitState.HALF_OPEN:
            self.trial_in_flight = True

    def record_success(self) -> None:
        if self.state is not CircuitState.CLOSED:
            logger.info("inference server %s is back in rotation", self.name)
        self.state = CircuitState.CLOSED
        self.consecutive_failures = 0
        self.trial_in_flight = False

    def record_failure(self) -> None:
        self.consecutive_failures += 1
        self.trial_in_flight = False
        if self.state is CircuitState.HALF_OPEN or (
            self.state is CircuitState.CLOSED
            and self.consecutive_failures >= self.failure_threshold
        ):
            self.trip()

    def trip(self, reason: str | None = None) -> None:
        """Take the server out of rotation for ``reset_after_s``."""
        if self.state is not CircuitState.OPEN:
            self.times_opened += 1
            logger.warning(
                "inference server %s taken out of rotation: %s",
                self.name,
                reason or f"{self.consecutive_failures} consecutive failures",
            )
        self.state = CircuitState.OPEN
        self.opened_at = self._clock()
