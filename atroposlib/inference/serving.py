"""Running a job for one HTTP request, and dropping it as soon as the client leaves.

Starlette does not cancel a handler when its client disconnects, so a watcher reads the
request's ASGI channel (the body has been read by then; the next message uvicorn sends is
``http.disconnect``) and cancels the job: the worker drops its rows before the next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Request, Response

from atroposlib.inference.batch import Sequence
from atroposlib.inference.jobs import Job, JobCancelled
from atroposlib.inference.scheduler import Scheduler

CLIENT_CLOSED_REQUEST = 499
"""The status logged for a request whose client left first (nginx's convention)."""


async def until_disconnected(request: Request) -> None:
    """Return once the client has closed the connection (call after the body is read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


@asynccontextmanager
async def cancelled_on_disconnect(
    request: Request, scheduler: Scheduler, job: Job
) -> AsyncIterator[None]:
    """Cancel ``job`` if the client disconnects, or if the block is left before it settles."""

    def client_left(watcher: asyncio.Task[None]) -> None:
        if not watcher.cancelled():
            watcher.exception()  # a broken channel counts as a client that left
            scheduler.cancel(job)

    watcher = asyncio.create_task(until_disconnected(request))
    watcher.add_done_callback(client_left)
    try:
        yield
    finally:
        watcher.cancel()
        if not job.settled:
            scheduler.cancel(job)


async def run_job(
    request: Request, scheduler: Scheduler, sequences: list[Sequence]
) -> list[Sequence] | Response:
    """The finished sequences, or an empty 499 response if the client left first."""
    job = scheduler.submit(sequences)
    async with cancelled_on_disconnect(request, scheduler, job):
        try:
            return await job.result()
        except JobCancelled:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
