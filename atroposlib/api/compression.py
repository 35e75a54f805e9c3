"""gzip for the broker's answers, with igzip (python-isal): a lean pure-ASGI middleware.

An answer of ``minimum_size`` bytes or more is gzipped when the request accepts gzip, as
Atropos's server does, except ``application/msgpack`` ones (packed arrays barely compress) and
answers that already carry a Content-Encoding. igzip at its level 1 is about 3x cheaper than
zlib's level 1 for a smaller output; that is the broker's largest cost per handed-out token.
Streamed answers (several body messages) pass through uncompressed; the broker sends none on
its hot paths.
"""

from __future__ import annotations

import logging

import anyio.to_thread
from isal import isal_zlib
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from atroposlib.wire.common import MSGPACK_CONTENT_TYPE

logger = logging.getLogger(__name__)

_GZIP_WBITS = 16 + 15
_THREAD_MINIMUM = 256 * 1024
"""Bodies this large are compressed in a worker thread, off the event loop (as starlette does)."""
_NOT_COMPRESSED = (MSGPACK_CONTENT_TYPE.encode(), b"application/gzip", b"image/", b"audio/")


def igzip_level(gzip_level: int) -> int:
    """igzip has levels 0-3: gzip levels 1-3 map to 1, 4-6 to 2, 7-9 to 3."""
    return max(1, min(3, (gzip_level + 2) // 3))


def accepts_gzip(accept_encoding: bytes | str | None) -> bool:
    if accept_encoding is None:
        return False
    if isinstance(accept_encoding, str):
        accept_encoding = accept_encoding.encode("latin-1")
    return b"gzip" in accept_encoding.lower()


def _accepts_gzip(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"accept-encoding":
            return accepts_gzip(value)
    return False


def _compressible_type(content_type: bytes) -> bool:
    return not content_type.lower().startswith(_NOT_COMPRESSED)


def _compressible(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name == b"content-encoding":
            return False
        if name == b"content-type" and not _compressible_type(value):
            return False
    return True


class Gzipper:
    """The compression itself, shared by the middleware and the broker's hot routes."""

    def __init__(self, *, minimum_size: int = 1000, gzip_level: int = 1) -> None:
        self.minimum_size = minimum_size
        self.level = igzip_level(gzip_level)

    def applies(self, size: int, content_type: bytes) -> bool:
        """An answer of ``size`` bytes of this type is worth compressing."""
        return size >= self.minimum_size and _compressible_type(content_type)

    async def compress(self, body: bytes) -> bytes:
        if len(body) >= _THREAD_MINIMUM:
            return await anyio.to_thread.run_sync(self.compress_now, body)
        return self.compress_now(body)

    def compress_now(self, body: bytes) -> bytes:
        return isal_zlib.compress(body, self.level, wbits=_GZIP_WBITS)


class GzipAnswers:
    """Pure ASGI middleware: gzip single-message answers of ``minimum_size`` bytes or more."""

    def __init__(self, app: ASGIApp, *, minimum_size: int = 1000, gzip_level: int = 1) -> None:
        self.app = app
        self.gzipper = Gzipper(minimum_size=minimum_size, gzip_level=gzip_level)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _accepts_gzip(scope):
            await self.app(scope, receive, send)
            return
        start: Message | None = None

        async def send_compressed(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            held, start = start, None
            body: bytes = message.get("body", b"")
            headers: list[tuple[bytes, bytes]] = list(held.get("headers", ()))
            if (
                message.get("more_body", False)
                or len(body) < self.gzipper.minimum_size
                or not _compressible(headers)
            ):
                await send(held)
                await send(message)
                return
            body = await self.gzipper.compress(body)
            headers = [(k, v) for k, v in headers if k != b"content-length"]
            headers += [
                (b"content-encoding", b"gzip"),
                (b"content-length", str(len(body)).encode()),
                (b"vary", b"Accept-Encoding"),
            ]
            await send({**held, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, send_compressed)
