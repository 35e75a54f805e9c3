"""A lean HTTP/1.1 keep-alive client for plain-http inference servers.

Rollouts make one request per group to servers on the local network; httpx spends more CPU per
request than the env itself. This client keeps a pool of asyncio streams and parses answers
with httptools (already installed with uvicorn[standard]). ``https://`` URLs use httpx.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

logger = logging.getLogger(__name__)


class HTTPTransportError(Exception):
    """The request could not be completed (connect, timeout, closed connection, bad answer)."""


@dataclass
class HTTPAnswer:
    status: int
    body: bytes


class _Reader:
    """httptools callbacks collecting one response."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.done = False

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.done = True


class LeanHTTPClient:
    """Requests to one ``http://host:port`` origin over a pool of keep-alive connections."""

    def __init__(
        self, origin: str, *, headers: dict[str, str], timeout: float, max_idle: int = 64
    ) -> None:
        parts = urlsplit(origin)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"LeanHTTPClient needs an http:// URL, got {origin!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.timeout = timeout
        self.max_idle = max_idle
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._head = f"Host: {parts.netloc}\r\n{extra}".encode()
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def request(
        self, method: str, path: str, body: bytes = b"", *, timeout: float | None = None
    ) -> HTTPAnswer:
        limit = self.timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                return await self._request(method, path, body)
        except TimeoutError as exc:
            raise HTTPTransportError(f"no answer within {limit} s") from exc

    async def _request(self, method: str, path: str, body: bytes) -> HTTPAnswer:
        reused = bool(self._idle)
        try:
            return await self._attempt(method, path, body)
        except HTTPTransportError:
            if not reused:
                raise
            return await self._attempt(method, path, body, fresh=True)

    async def _attempt(
        self, method: str, path: str, body: bytes, fresh: bool = False
    ) -> HTTPAnswer:
        if fresh:
            await self.aclose()
        reader, writer = self._idle.pop() if self._idle else await self._connect()
        keep = False
        try:
            request = (
                f"{method} {path} HTTP/1.1\r\n".encode()
                + self._head
                + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            writer.write(request)
            await writer.drain()
            collected = _Reader()
            parser = httptools.HttpResponseParser(collected)
            while not collected.done:
                data = await reader.read(65536)
                if not data:
                    raise HTTPTransportError("connection closed by the server")
                parser.feed_data(data)
            keep = parser.should_keep_alive()
            return HTTPAnswer(parser.get_status_code(), b"".join(collected.chunks))
        except (OSError, httptools.HttpParserError) as exc:
            raise HTTPTransportError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            if keep and len(self._idle) < self.max_idle:
                self._idle.append((reader, writer))
            else:
                writer.close()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            raise HTTPTransportError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc

    async def aclose(self) -> None:
        while self._idle:
            _, writer = self._idle.pop()
            writer.close()
