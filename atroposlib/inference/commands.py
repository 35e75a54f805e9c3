"""The commands callers hand the scheduler's thread, and the thread-safe callback answering them.

The scheduler takes them between two decode steps (:mod:`atroposlib.inference.scheduler`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor
from transformers import PreTrainedModel

from atroposlib.inference.jobs import Job
from atroposlib.wire.engine import PauseMode

Done = Callable[[Any], None]
"""Called once, from any thread, with the result or the exception."""


@dataclass
class Submit:
    job: Job


@dataclass
class Cancel:
    job: Job


@dataclass
class Swap:
    model: PreTrainedModel
    version: int | None
    done: Callable[[int | BaseException], None]


@dataclass
class Pause:
    mode: PauseMode
    done: Done


@dataclass
class Resume:
    done: Done


@dataclass
class Install:
    tensors: dict[str, Tensor]
    version: int | None
    done: Done


@dataclass
class Recompute:
    """Preempt every running row: each resumes by recomputing its context (new weights)."""

    done: Done


Command = Submit | Cancel | Swap | Pause | Resume | Install | Recompute


def resolver(future: asyncio.Future[Any]) -> Done:
    """A thread-safe callback that settles ``future`` with a result or an exception."""
    loop = future.get_loop()

    def settle(outcome: object) -> None:
        if future.done():
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    def resolve(outcome: object) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            loop.call_soon_threadsafe(settle, outcome)

    return resolve
