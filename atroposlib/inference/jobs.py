"""One request's sequences on their way through the scheduler, seen from both sides.

A job is *queued* (no row in the batch yet), *running* (rows in the batch; a row may be
preempted back to the queue with its tokens and resumed later) and then *settled*
exactly once: finished (every sequence done), cancelled (its client left) or failed.
The worker thread owns the queue and the counters; the event loop that submitted the
job awaits :meth:`Job.result` or iterates :meth:`Job.updates` (streaming). Everything
crossing between the two goes through ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from atroposlib.inference.batch import Sequence

_job_ids = itertools.count()


class JobCancelled(Exception):
    """The job was cancelled (its client left) before it finished."""


@dataclass(frozen=True)
class SequenceUpdate:
    """What one sequence produced since its last update (streaming)."""

    index: int
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    finish_reason: str | None
    text: str
    """The final text once ``finish_reason`` is set (stop strings cut off), else ``""``."""


class Job:
    """The sequences of one request; answered together, or streamed step by step."""

    def __init__(self, sequences: list[Sequence], stream: bool = False) -> None:
        self.id = next(_job_ids)
        self.sequences = sequences
        self.stream = stream
        # worker-thread state
        self.unstarted: deque[Sequence] = deque(sequences)
        self.preempted: deque[Sequence] = deque()
        self.running = 0
        self.unfinished = len(sequences)
        self.index = {id(seq): i for i, seq in enumerate(sequences)}
        self.reported = [0] * len(sequences)
        # event-loop state
        self._loop = asyncio.get_running_loop()
        self._outcome: asyncio.Future[list[Sequence]] = self._loop.create_future()
        self._updates: asyncio.Queue[list[SequenceUpdate] | None] = asyncio.Queue()

    @property
    def settled(self) -> bool:
        """Answered, cancelled or failed (as the event loop has heard so far)."""
        return self._outcome.done()

    @property
    def waiting(self) -> int:
        return len(self.unstarted) + len(self.preempted)

    # -- worker thread ----------------------------------------------------------------

    def publish(self, rows: list[Sequence]) -> None:
        """Send each row's tokens produced since its last update (streaming jobs only)."""
        updates = []
        for row in rows:
            i = self.index[id(row)]
            start, self.reported[i] = self.reported[i], len(row.output_ids)
            top = row.top_logprobs[start:] if row.params.top_logprobs else []
            updates.append(
                SequenceUpdate(
                    index=i,
                    token_ids=row.output_ids[start:],
                    logprobs=row.logprobs[start:],
                    top_logprobs=top,
                    finish_reason=row.finish_reason,
                    text=row.text if row.finished else "",
                )
            )
        if updates:
            self._call(self._updates.put_nowait, updates)

    def settle(self, outcome: list[Sequence] | BaseException) -> None:
        """Finish the job with its sequences or an error; later calls are ignored."""
        self._call(self._settle, outcome)

    def _call(self, callback: object, argument: object) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            self._loop.call_soon_threadsafe(callback, argument)  # type: ignore[arg-type]

    # -- event loop -------------------------------------------------------------------

    def _settle(self, outcome: list[Sequence] | BaseException) -> None:
        if self._outcome.done():
            return
        if isinstance(outcome, BaseException):
            self._outcome.set_exception(outcome)
            self._outcome.exception()  # retrieved here: a client that left never awaits it
        else:
            self._outcome.set_result(outcome)
        self._updates.put_nowait(None)

    async def result(self) -> list[Sequence]:
        """The finished sequences; raises :class:`JobCancelled` or the failure."""
        return await asyncio.shield(self._outcome)

    async def updates(self) -> AsyncIterator[list[SequenceUpdate]]:
        """Per-step updates until the job settles; then raises its failure, if any."""
        while (batch := await self._updates.get()) is not None:
            yield batch
        await self.result()
