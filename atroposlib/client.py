"""Clients of the broker: :class:`TrainerClient` (sync) and :class:`EnvClient` (async).

Both speak JSON (what Atropos's broker understands) or the fast msgpack encoding (ours). Groups
handed to a trainer carry their per-token fields as 1-D numpy arrays (int32 token ids and masks,
float32 float arrays) whatever the encoding.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self

import httpx

from atroposlib import codec
from atroposlib.errors import BrokerRejectedError, BrokerUnavailableError, RequestBodyError
from atroposlib.wire.broker import (
    Acknowledgement,
    EnvRef,
    EnvRegistration,
    EnvRegistrationResponse,
    EnvStatusResponse,
    InfoResponse,
    ScoredData,
    ScoredDataListResponse,
    StatusResponse,
    TrainerRegistration,
    TrainerRegistrationResponse,
    WandbInfoResponse,
)
from atroposlib.wire.common import JSON_CONTENT_TYPE, MSGPACK_CONTENT_TYPE

logger = logging.getLogger(__name__)

Encoding = Literal["json", "msgpack"]
_WAITING = "wait for trainer to start"
_MAX_BACKOFF = 30.0


@dataclass
class Batch:
    """One trainer batch: its step (None from brokers that do not number them) and groups."""

    step: int | None
    groups: list[dict[str, Any]]


def backoff_delays(first: float, cap: float, factor: float = 1.5) -> Iterator[float]:
    """Waits between polls: ``first``, then ``factor`` times longer each time, at most ``cap``.

    >>> from itertools import islice
    >>> [round(d, 3) for d in islice(backoff_delays(0.25, 1.0), 6)]
    [0.25, 0.375, 0.562, 0.844, 1.0, 1.0]
    """
    delay = first
    while True:
        yield min(delay, cap)
        delay = min(delay * factor, cap)


def _headers(api_key: str | None, encoding: Encoding) -> dict[str, str]:
    media = MSGPACK_CONTENT_TYPE if encoding == "msgpack" else JSON_CONTENT_TYPE
    headers = {"Accept": media, "Accept-Encoding": "gzip"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _detail(response: httpx.Response) -> object:
    try:
        return codec.decode(response.content, response.headers.get("content-type"))["detail"]
    except (KeyError, TypeError, ValueError, RequestBodyError):
        return response.text


def _decoded(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        if response.status_code >= 500:
            raise BrokerUnavailableError(f"broker answered {response.status_code}")
        raise BrokerRejectedError(response.status_code, _detail(response))
    return codec.decode(response.content, response.headers.get("content-type"))


class TrainerClient:
    """The trainer's side: register, pull batches, acknowledge them.

    A trainer that registers with ``acknowledges=True`` names the last step it received in
    every ``GET /batch`` (``?received=N``), so a batch whose answer was lost on the way (a
    timeout, a reset connection) is sent again instead of being skipped.
    """

    def __init__(
        self,
        base_url: str = "http://localhost:8000",
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        encoding: Encoding = "msgpack",
        http_client: httpx.Client | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = _headers(api_key, encoding)
        self._owns_client = http_client is None
        self._http = http_client or httpx.Client(timeout=timeout)
        self.received_step: int | None = None

    def _call(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        try:
            response = self._http.request(
                method, self.base_url + path, headers=self._headers, json=body, params=params
            )
        except httpx.TransportError as err:
            raise BrokerUnavailableError(f"broker at {self.base_url} unreachable: {err}") from err
        return _decoded(response)

    def register(self, registration: TrainerRegistration) -> int:
        answer = self._call("POST", "/register", registration.model_dump())
        uuid = TrainerRegistrationResponse.model_validate(answer).uuid
        self.received_step = registration.starting_step if registration.acknowledges else None
        return uuid

    def get_batch(self) -> Batch | None:
        received = self.received_step
        answer = self._call(
            "GET", "/batch", params=None if received is None else {"received": received}
        )
        if answer.get("batch") is None:
            return None
        step = answer.get("step")
        if received is not None and isinstance(step, int):
            self.received_step = step
        return Batch(step, [codec.unpack_group(g) for g in answer["batch"]])

    def wait_for_batch(
        self, poll_interval: float = 0.25, timeout: float | None = None, max_interval: float = 2.0
    ) -> Batch:
        """Poll ``GET /batch`` until a batch is ready, backing off from ``poll_interval`` to
        ``max_interval`` (a trainer waiting a minute on its envs asks ~35 times, not 120)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delays = backoff_delays(poll_interval, max_interval)
        while (batch := self.get_batch()) is None:
            delay = next(delays)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no batch from {self.base_url} within {timeout} s")
                delay = min(delay, left)
            time.sleep(delay)
        return batch

    def ack(self, step: int) -> None:
        self._call("POST", "/ack", Acknowledgement(step=step).model_dump())

    def status(self) -> StatusResponse:
        return StatusResponse.model_validate(self._call("GET", "/status"))

    def info(self) -> InfoResponse:
        return InfoResponse.model_validate(self._call("GET", "/info"))

    def close(self) -> None:
        if self._owns_client:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class EnvClient:
    """An environment's side: register, watch backpressure, post scored groups (retried)."""

    def __init__(
        self,
        base_url: str = "http://localhost:8000",
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        encoding: Encoding = "msgpack",
        http_client: httpx.AsyncClient | None = None,
        compress: bool = True,
        max_retries: int = 5,
        backoff: float = 0.5,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.encoding = encoding
        self.compress = compress
        self.max_retries = max_retries
        self.backoff = backoff
        self._headers = _headers(api_key, encoding)
        self._owns_client = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=timeout)

    async def _send(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request, retried on connection errors and 5xx (503 Retry-After honoured)."""
        headers = {**self._headers, **kwargs.pop("headers", {})}
        for attempt in range(self.max_retries + 1):
            delay = min(self.backoff * 2**attempt, _MAX_BACKOFF)
            try:
                response = await self._http.request(
                    method, self.base_url + path, headers=headers, **kwargs
                )
            except httpx.TransportError as err:
                reason = f"unreachable: {err!r}"
            else:
                if response.status_code < 500:
                    return _decoded(response)
                reason = f"answered {response.status_code}"
                retry_after = response.headers.get("retry-after", "")
                if retry_after.replace(".", "", 1).isdigit():
                    delay = float(retry_after)
            if attempt < self.max_retries:
                logger.info("broker %s %s; retry in %.1f s", reason, path, delay)
                await asyncio.sleep(delay)
        raise BrokerUnavailableError(
            f"broker at {self.base_url} {reason} after {self.max_retries} retries"
        )

    async def register_env(
        self, registration: EnvRegistration, *, wait_timeout: float | None = None
    ) -> EnvRegistrationResponse:
        """Register, polling while the broker says the trainer has not started yet."""
        deadline = None if wait_timeout is None else time.monotonic() + wait_timeout
        while True:
            answer = await self._send("POST", "/register-env", json=registration.model_dump())
            if answer.get("status") != _WAITING:
                return EnvRegistrationResponse.model_validate(answer)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"trainer did not start within {wait_timeout} s")
            await asyncio.sleep(1.0)

    async def wandb_info(self) -> WandbInfoResponse:
        return WandbInfoResponse.model_validate(await self._send("GET", "/wandb_info"))

    async def info(self) -> InfoResponse:
        return InfoResponse.model_validate(await self._send("GET", "/info"))

    async def status_env(self, env_id: int) -> EnvStatusResponse:
        body = EnvRef(env_id=env_id).model_dump()
        answer = await self._send("GET", "/status-env", params=body, json=body)
        return EnvStatusResponse.model_validate(answer)

    def _encode_groups(self, groups: Sequence[ScoredData | Mapping[str, Any]]) -> bytes:
        prepared = []
        for group in groups:
            data = group.model_dump() if isinstance(group, ScoredData) else dict(group)
            if data.get("group_id") is None:
                data["group_id"] = uuid.uuid4().hex
            prepared.append(codec.pack_group(data) if self.encoding == "msgpack" else data)
        body, _ = codec.encode(
            prepared, MSGPACK_CONTENT_TYPE if self.encoding == "msgpack" else None
        )
        return body

    async def post_groups(
        self, groups: Sequence[ScoredData | Mapping[str, Any]]
    ) -> ScoredDataListResponse:
        """Post groups in one request; each gets a ``group_id`` so retries never duplicate."""
        body = self._encode_groups(groups)
        media = MSGPACK_CONTENT_TYPE if self.encoding == "msgpack" else JSON_CONTENT_TYPE
        headers = {"Content-Type": media}
        if self.compress:
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        answer = await self._send("POST", "/scored_data_list", content=body, headers=headers)
        return ScoredDataListResponse.model_validate(answer)

    async def disconnect_env(self, env_id: int) -> None:
        await self._send("POST", "/disconnect-env", json=EnvRef(env_id=env_id).model_dump())

    async def aclose(self) -> None:
        if self._owns_client:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
