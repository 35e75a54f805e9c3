"""Where exported groups come from: JSONL dumps or a live broker, as a stream of batches.

The broker source registers as a data-only trainer (as Atropos's exporters did) and
acknowledges each batch only after the caller has written its lines, so with a durable
broker a crash of the exporter never loses a batch. It never resets the broker unless
``reset_first`` is set explicitly.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from atroposlib.export.groups import plain_group, read_group_files
from atroposlib.wire.broker import TrainerRegistration

logger = logging.getLogger(__name__)


@dataclass
class SourceBatch:
    groups: list[dict[str, Any]]
    step: int | None = None
    """The broker step to acknowledge once written; None for files."""


class GroupSource(Protocol):
    def batches(self) -> Iterator[SourceBatch]: ...

    def written(self, batch: SourceBatch) -> None:
        """Called once every line made from ``batch`` is on disk."""
        ...


class FileSource:
    """Groups read from JSONL dumps, in chunks of ``chunk`` groups."""

    def __init__(self, paths: Iterable[str], chunk: int = 64) -> None:
        self._paths = list(paths)
        self._chunk = chunk

    def batches(self) -> Iterator[SourceBatch]:
        groups = read_group_files(self._paths)
        while chunk := list(itertools.islice(groups, self._chunk)):
            yield SourceBatch(chunk)

    def written(self, batch: SourceBatch) -> None:
        return None


class TrainerLike(Protocol):
    """The calls of ``atroposlib.client.TrainerClient`` that the broker source makes."""

    def register(self, registration: TrainerRegistration) -> int: ...

    def get_batch(self) -> Any: ...

    def ack(self, step: int) -> Any: ...


@dataclass(frozen=True)
class BrokerRegistration:
    """What the exporter tells the broker when it registers as a (data-only) trainer."""

    batch_size: int
    max_token_len: int
    name: str
    num_steps: int

    def as_trainer(self) -> TrainerRegistration:
        return TrainerRegistration(
            wandb_group=self.name,
            wandb_project="atroposlib-export",
            batch_size=self.batch_size,
            max_token_len=self.max_token_len,
            checkpoint_dir="",
            save_checkpoint_interval=0,
            starting_step=0,
            num_steps=self.num_steps,
            acknowledges=True,
        )


class BrokerSource:
    """Batches pulled from a live broker with ``GET /batch``, polled while none is ready.

    ``idle_timeout`` (seconds, None for no limit) ends the stream when no batch arrived for
    that long; the clock and sleep are injectable for tests.
    """

    def __init__(
        self,
        client: TrainerLike,
        registration: BrokerRegistration,
        *,
        poll_interval: float = 1.0,
        idle_timeout: float | None = None,
        reset_first: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._client = client
        self._registration = registration
        self._poll_interval = poll_interval
        self._idle_timeout = idle_timeout
        self._reset_first = reset_first
        self._clock = clock
        self._sleep = sleep
        self.timed_out = False

    def batches(self) -> Iterator[SourceBatch]:
        if self._reset_first is not None:
            logger.warning("resetting the broker's queue before registering, as asked")
            self._reset_first()
        self._client.register(self._registration.as_trainer())
        last_data = self._clock()
        while True:
            batch = self._client.get_batch()
            if batch is None:
                if (
                    self._idle_timeout is not None
                    and self._clock() - last_data >= self._idle_timeout
                ):
                    logger.info("no batch for %.0f s; stopping", self._idle_timeout)
                    self.timed_out = True
                    return
                self._sleep(self._poll_interval)
                continue
            last_data = self._clock()
            yield SourceBatch([plain_group(group) for group in batch.groups], batch.step)

    def written(self, batch: SourceBatch) -> None:
        if batch.step is not None:
            self._client.ack(batch.step)


def reset_broker(api_url: str, api_key: str | None = None, timeout: float = 30.0) -> None:
    """``GET /reset_data``: empties the broker's queue. Only ever called on explicit request."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    response = httpx.get(f"{api_url.rstrip('/')}/reset_data", headers=headers, timeout=timeout)
    response.raise_for_status()
