"""How many CPU threads the next decode step may use: more while other processes leave cores idle.

On a small machine the inference server shares the cores with a trainer that is busy only part
of the time (it waits for batches, the held-out evaluations run without it). With
``--max-threads`` the server measures, every ``period_s``, how many cores the *other*
processes used (the machine's busy time from ``/proc/stat`` less this process's own CPU time)
and takes the cores they left idle, between ``--threads`` and ``--max-threads``. Two busy
processes each running a thread per core slow each other down far more than they gain, so
the moment the others need their cores back (within one period), the server returns to
``--threads``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

PERIOD_S = 0.25
"""How often the machine's load is read (a step of the demo's batch takes ~0.1 s)."""
IDLE_MARGIN = 0.25
"""A core counts as idle when the others used less than this share of it."""


def machine_busy_seconds(stat: Path = Path("/proc/stat"), niced_yield: bool | None = None) -> float:
    """CPU seconds every core of the machine has spent busy (not idle or waiting on I/O).

    Time of niced processes counts as idle while this process is not niced itself
    (``niced_yield``, by default): the kernel gives a niced process's core to us at once (a
    nice-19 process gets ~1.5 % of a core beside a normal one), so background jobs on a shared
    machine do not keep the server at ``--threads``."""
    if niced_yield is None:
        niced_yield = os.nice(0) == 0
    fields = stat.read_text().splitlines()[0].split()[1:]
    jiffies = [int(value) for value in fields[:8]]  # user nice system idle iowait irq softirq steal
    idle = jiffies[3] + jiffies[4] + (jiffies[1] if niced_yield else 0)
    return (sum(jiffies) - idle) / os.sysconf("SC_CLK_TCK")


def cores_of_this_machine() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class ThreadGovernor:
    """Threads for the next step: ``base``, or up to ``most`` while the others leave cores idle.

    ``busy`` (the machine's busy CPU seconds), ``own`` (this process's CPU seconds) and
    ``clock`` are injectable for tests."""

    def __init__(
        self,
        base: int,
        most: int,
        *,
        cores: int | None = None,
        period_s: float = PERIOD_S,
        busy: Callable[[], float] = machine_busy_seconds,
        own: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if most < base:
            raise ValueError(f"most ({most}) must be >= base ({base})")
        self.base, self.most = base, most
        self.cores = cores or cores_of_this_machine()
        self.period_s = period_s
        self._busy, self._own, self._clock = busy, own, clock
        self._last = (clock(), busy(), own())
        self.threads = base

    def threads_now(self) -> int:
        """The thread count for the next step (re-measured at most once a period)."""
        now = self._clock()
        then, busy_then, own_then = self._last
        elapsed = now - then
        if elapsed < self.period_s:
            return self.threads
        busy, own = self._busy(), self._own()
        self._last = (now, busy, own)
        others = max(0.0, (busy - busy_then) - (own - own_then)) / elapsed  # cores they used
        idle = self.cores - math.ceil(others - IDLE_MARGIN) if others > IDLE_MARGIN else self.cores
        self.threads = max(self.base, min(self.most, idle))
        return self.threads
