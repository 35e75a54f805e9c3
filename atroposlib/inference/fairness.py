"""Which requests get the batch's rows: max-min fair shares, and whom to preempt for them.

Pure functions over counts; :mod:`atroposlib.inference.scheduler` applies the plan between
decode steps. Every request that wants rows gets an equal share of the batch (a request
that wants less than its share leaves the rest to the others); when a request has fewer
rows than its share while another holds more, the other's excess rows are preempted (their
tokens are kept and recomputed on resume), so one huge request delays a small one by a
decode step or two, not by its whole length.
"""

from __future__ import annotations

from dataclasses import dataclass


def fair_shares(demands: list[int], capacity: int) -> list[int]:
    """Max-min fair split of ``capacity`` rows among requests wanting ``demands`` rows.

    Earlier requests (lower index) get the remainder when it does not split evenly, and
    when there are more requests than rows.

    >>> fair_shares([100, 1, 3], 16)
    [12, 1, 3]
    >>> fair_shares([100, 100], 15)
    [8, 7]
    >>> fair_shares([1, 1, 1], 2)
    [1, 1, 0]
    >>> fair_shares([2, 0], 16)
    [2, 0]
    """
    shares = [0] * len(demands)
    left = capacity
    wanting = [i for i, demand in enumerate(demands) if demand > 0]
    while left > 0 and wanting:
        each = max(1, left // len(wanting))
        for i in wanting:
            give = min(each, demands[i] - shares[i], left)
            shares[i] += give
            left -= give
            if left == 0:
                break
        wanting = [i for i in wanting if shares[i] < demands[i]]
    return shares


@dataclass(frozen=True)
class Plan:
    """What to change before the next step, per request (same order as the input)."""

    preempt: list[int]
    admit: list[int]


def plan_step(running: list[int], waiting: list[int], capacity: int) -> Plan:
    """Rows to preempt and rows to admit so every request moves toward its fair share.

    ``running[i]`` rows of request ``i`` are in the batch, ``waiting[i]`` more want in.
    Rows are preempted only to make room for a request below its share; free rows are
    handed out by share first, then to whoever still waits.

    >>> plan_step(running=[16, 0], waiting=[3184, 1], capacity=16)
    Plan(preempt=[1, 0], admit=[0, 1])
    >>> plan_step(running=[8, 8], waiting=[0, 50], capacity=16)
    Plan(preempt=[0, 0], admit=[0, 0])
    >>> plan_step(running=[3, 0], waiting=[0, 40], capacity=16)
    Plan(preempt=[0, 0], admit=[0, 13])
    """
    demands = [r + w for r, w in zip(running, waiting, strict=True)]
    shares = fair_shares(demands, capacity)
    wanted = [min(max(s - r, 0), w) for s, r, w in zip(shares, running, waiting, strict=True)]
    free = capacity - sum(running)
    shortfall = sum(wanted) - free
    preempt = [0] * len(running)
    for i, (share, held) in enumerate(zip(shares, running, strict=True)):
        if shortfall <= 0:
            break
        excess = min(held - share, shortfall) if held > share else 0
        preempt[i] = excess
        shortfall -= excess
    room = free + sum(preempt)
    admit = [0] * len(running)
    for i, want in enumerate(wanted):
        admit[i] = min(want, room)
        room -= admit[i]
    for i, (w, taken) in enumerate(zip(waiting, admit, strict=True)):
        if room <= 0:
            break
        more = min(w - taken, room) if preempt[i] == 0 else 0
        admit[i] += more
        room -= more
    return Plan(preempt=preempt, admit=admit)
