"""uvicorn's httptools protocol, sending each response's head and body in one system call.

uvicorn writes an answer's status line and headers as soon as the app starts the response,
then the body in a second write. On a connection with Nagle off (uvicorn's default) that is two
packets, two wake-ups of the client and two system calls per request: for the broker's small
answers the first write alone was ~16% of its CPU (py-spy, benchmarks/broker_throughput.py,
G=8 L=512 msgpack). :class:`CoalescingTransport` holds the head until the body's write and
sends both with one ``writelines`` (a single writev); a head without a body (HEAD, 204, or
an app that never sends one) goes out at the end of the event-loop iteration.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

logger = logging.getLogger(__name__)


class CoalescingTransport:
    """Wraps a transport; every attribute but ``write`` and ``close`` is the transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.writelines((head, data))
            return
        if isinstance(data, bytes) and data.startswith(b"HTTP/") and data.endswith(b"\r\n\r\n"):
            self._head = data
            self._loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        head, self._head = self._head, None
        if head is not None and not self._transport.is_closing():
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """Pass as ``uvicorn.run(..., http=CoalescingHttpToolsProtocol)``."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        wrapped = CoalescingTransport(transport, self.loop)
        super().connection_made(wrapped)  # type: ignore[arg-type]
