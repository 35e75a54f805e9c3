"""Is the run going wrong? Held-out snapshots, the best one, and the three warnings.

A sampled training reward can rise while the policy collapses (issue 35: a reply reduced to
the format alone, 9 % held-out strict falling to 0.5 %). Two signs show it while the run goes:

- held-out strict accuracy well below its best snapshot so far (``accuracy_warning``);
- almost every group dropped as uninformative, all its rewards equal and below the best
  reward seen, far more than at the start (``dropped_groups_warning``): the policy answers
  every prompt alike and not well, and each step needs many more groups. Groups dropped
  with the best reward (the task solved) do not count (``failing_groups``).

A third warning is of a run that cannot train at all: groups not sent because a sequence is
longer than the token budget (``over_budget_warning``); a task whose prompts outgrow
``max_token_len`` would otherwise train on nothing, silently.

Everything here is a pure function of what the run recorded, so it is tested as a table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DROPPED_WINDOW = 40
"""Groups compared: the run's first ones against its latest ones."""
DROPPED_RISE = 0.3
"""How much more of the latest window must be dropped than of the first one."""


@dataclass(frozen=True)
class Snapshot:
    """Greedy held-out accuracy of the weights the inference server served at ``step``."""

    step: int
    """Trainer steps done when the evaluation started (0: the base model)."""
    weight_version: int | None
    """The served weights when it started (they may change while it runs)."""
    strict: float
    lenient: float
    format: float
    seconds: float


def best_snapshot(snapshots: Sequence[Snapshot]) -> Snapshot | None:
    """The highest strict accuracy; the earliest of equals.

    >>> s = [Snapshot(0, 0, 0.1, 0.1, 0.2, 1.0), Snapshot(5, 5, 0.3, 0.3, 0.9, 1.0),
    ...      Snapshot(10, 10, 0.3, 0.4, 1.0, 1.0)]
    >>> best_snapshot(s).step
    5
    """
    best: Snapshot | None = None
    for snapshot in snapshots:
        if best is None or snapshot.strict > best.strict:
            best = snapshot
    return best


def accuracy_warning(snapshots: Sequence[Snapshot], drop: float) -> str | None:
    """A warning when the latest snapshot's strict accuracy is more than ``drop`` (absolute,
    0.10 = 10 points) below the best one so far."""
    best = best_snapshot(snapshots)
    if best is None:
        return None
    latest = snapshots[-1]
    if best.strict - latest.strict <= drop:
        return None
    return (
        f"held-out strict accuracy {100 * latest.strict:.1f} % at step {latest.step} is "
        f"{100 * (best.strict - latest.strict):.1f} points below its best, "
        f"{100 * best.strict:.1f} % at step {best.step} (format {100 * latest.format:.0f} %): "
        "the policy may be collapsing; checkpoints/best keeps the best weights"
    )


def failing_groups(groups: Sequence[tuple[bool, float]]) -> list[bool]:
    """Per group (dropped?, mean reward), in order: dropped below the best mean seen so far.

    >>> failing_groups([(True, 0.5), (False, 1.0), (True, 1.5), (True, 0.5), (True, 1.5)])
    [False, False, False, True, False]
    """
    flags, best = [], -float("inf")
    for dropped, reward in groups:
        best = max(best, reward)
        flags.append(dropped and reward < best)
    return flags


def dropped_share(dropped: Sequence[bool]) -> float:
    return sum(dropped) / len(dropped) if dropped else 0.0


def dropped_groups_warning(
    dropped: Sequence[bool], share: float, window: int = DROPPED_WINDOW, rise: float = DROPPED_RISE
) -> str | None:
    """A warning when at least ``share`` of the latest ``window`` groups were dropped as
    uninformative and below the best reward, ``rise`` more than of the run's first ``window``
    groups (``dropped``: :func:`failing_groups`, in the order the env wrote them)."""
    if len(dropped) < 2 * window:
        return None
    first, latest = dropped_share(dropped[:window]), dropped_share(dropped[-window:])
    if latest < share or latest - first < rise:
        return None
    return (
        f"{100 * latest:.0f} % of the last {window} groups were dropped as uninformative "
        f"(all rewards equal, below the best seen), {100 * first:.0f} % of the first {window}: "
        "the policy answers every prompt alike and not well (collapsed?) and each step needs "
        "many more groups"
    )


def over_budget_warning(
    longest: Sequence[int], budget: int, window: int = DROPPED_WINDOW
) -> str | None:
    """A warning when any of the latest ``window`` groups was not sent for a sequence over
    the token budget (``longest``: per group in the order the env wrote them, its longest
    sequence when that was over ``budget``, else 0)."""
    latest = longest[-window:]
    over = [tokens for tokens in latest if tokens]
    if not over:
        return None
    return (
        f"{len(over)} of the last {len(latest)} groups were not sent: a sequence of up to "
        f"{max(over)} tokens, over max_token_len {budget} (prompt and reply); raise "
        "--max-token-len or the env config's env.max_token_length"
    )
