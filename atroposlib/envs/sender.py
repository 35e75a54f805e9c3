"""Sends groups to the broker in batches; spools them to disk while the broker is away."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from typing import Any, Protocol

from atroposlib.envs.spool import Spool
from atroposlib.errors import BrokerRejectedError, BrokerUnavailableError

logger = logging.getLogger(__name__)

MAX_GROUPS_PER_POST = 64


class GroupPoster(Protocol):
    async def post_groups(self, groups: Sequence[Any]) -> Any: ...


class GroupSender:
    """A queue in front of ``post_groups``: workers never wait for the broker.

    Every group carries a ``group_id`` fixed before its first attempt, so a resend after a
    timeout or a broker restart is deduplicated by the broker: each group arrives once.
    """

    def __init__(
        self,
        client: GroupPoster,
        spool: Spool,
        *,
        on_unknown_env: Callable[[], Awaitable[int]] | None = None,
        retry_interval_s: float = 1.0,
    ) -> None:
        self.client = client
        self.spool = spool
        self.on_unknown_env = on_unknown_env
        self.retry_interval_s = retry_interval_s
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sent = 0
        self.post_limit = MAX_GROUPS_PER_POST
        self.posting = 0
        self.rejected = 0
        self.unauthorized = False
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="group-sender")

    @property
    def started(self) -> bool:
        return self._task is not None

    def submit(self, group: dict[str, Any]) -> None:
        self._idle.clear()
        self.queue.put_nowait(group)

    @property
    def backlog(self) -> int:
        """Groups generated but not yet acknowledged by the broker."""
        return self.queue.qsize() + len(self.spool) + (0 if self.spool else self.posting)

    async def _run(self) -> None:
        while True:
            if len(self.spool):
                self._drain_queue_into_spool()
                if not await self._send(self.spool.oldest(self.post_limit), spooled=True):
                    await asyncio.sleep(self.retry_interval_s)
                continue
            if self.queue.empty():
                self._idle.set()
            batch = [await self.queue.get()]
            while not self.queue.empty() and len(batch) < self.post_limit:
                batch.append(self.queue.get_nowait())
            await self._send(batch, spooled=False)

    def _drain_queue_into_spool(self) -> None:
        waiting = []
        while not self.queue.empty():
            waiting.append(self.queue.get_nowait())
        if waiting:
            self.spool.add(waiting)

    async def _send(self, batch: list[dict[str, Any]], *, spooled: bool) -> bool:
        self.posting = len(batch)
        try:
            await self.client.post_groups(batch)
        except BrokerUnavailableError as exc:
            # a full broker may take a few groups but not all of them: post fewer at a time
            self.post_limit = max(1, len(batch) // 2)
            if not spooled:
                logger.warning("broker unreachable (%s): spooling %d groups", exc, len(batch))
                self.spool.add(batch)
            return False
        except BrokerRejectedError as exc:
            return await self._rejected(batch, exc, spooled=spooled)
        finally:
            self.posting = 0
        self.unauthorized = False
        self.sent += len(batch)
        self.post_limit = min(MAX_GROUPS_PER_POST, self.post_limit * 2)
        if spooled:
            self.spool.ack([group["group_id"] for group in batch])
            logger.info("broker is back: resent %d spooled groups", len(batch))
        return True

    async def _rejected(
        self, batch: list[dict[str, Any]], exc: BrokerRejectedError, *, spooled: bool
    ) -> bool:
        if exc.status_code == 401:  # the broker wants another key: keep them for a run that has it
            if not self.unauthorized:
                logger.error(
                    "broker refused the API key: groups stay spooled at %s", self.spool.path
                )
            self.unauthorized = True
            if not spooled:
                self.spool.add(batch)
            return False
        if exc.status_code == 404 and self.on_unknown_env is not None:
            env_id = await self.on_unknown_env()
            for group in batch:
                group["env_id"] = env_id
            if not spooled:
                self.spool.add(batch)
            return False
        if len(batch) > 1:
            results = [await self._send([group], spooled=spooled) for group in batch]
            return all(results)
        self.rejected += 1
        logger.error("broker rejected group %s: %s", batch[0].get("group_id"), exc.detail)
        if spooled:
            self.spool.ack([batch[0]["group_id"]])
        return True

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted group is acknowledged; False on timeout."""
        try:
            await asyncio.wait_for(self._wait_empty(), timeout)
        except TimeoutError:
            return False
        return True

    async def _wait_empty(self) -> None:
        while self.backlog or not self._idle.is_set():
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        self.spool.close()
