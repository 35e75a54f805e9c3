"""HTTP plumbing of the broker: capped (and gzip-capped) bodies, encoded answers, auth."""

from __future__ import annotations

import logging
import zlib
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from atroposlib import codec
from atroposlib.api.settings import BrokerSettings
from atroposlib.errors import RequestBodyError

logger = logging.getLogger(__name__)

ModelT = TypeVar("ModelT", bound=BaseModel)
_CHUNK = 1 << 20


class Inflater:
    """Incremental gzip inflation that stops as soon as the output passes ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._out = bytearray()

    def feed(self, data: bytes) -> None:
        if self._inflater.eof and data:
            raise RequestBodyError(400, "gzip body has trailing data after its end")
        pending = data
        while True:
            room = min(self.limit - len(self._out) + 1, _CHUNK)
            try:
                produced = self._inflater.decompress(pending, room)
            except zlib.error as err:
                raise RequestBodyError(
                    400, f"body is not valid gzip ({err}); drop Content-Encoding or fix the body"
                ) from err
            self._out += produced
            if len(self._out) > self.limit:
                raise RequestBodyError(
                    413, f"inflated body exceeds {self.limit} bytes (max_inflated_bytes)"
                )
            pending = self._inflater.unconsumed_tail
            if self._inflater.eof or (not pending and len(produced) < room):
                break
        if self._inflater.unused_data:
            raise RequestBodyError(400, "gzip body has trailing data after its end")

    def finish(self) -> bytes:
        self.feed(b"")
        if not self._inflater.eof:
            raise RequestBodyError(400, "gzip body is truncated; send the whole gzip stream")
        return bytes(self._out)


async def read_body(request: Request, settings: BrokerSettings) -> bytes:
    """The request body, inflated when gzip, within the size limits (413) or a 400."""
    return await read_body_chunks(request.headers, request.stream(), settings)


async def read_body_chunks(
    headers: Mapping[str, str], chunks: AsyncIterator[bytes], settings: BrokerSettings
) -> bytes:
    """:func:`read_body` for a body arriving as ``chunks`` with these (lower-case) headers."""
    limit = settings.max_request_bytes
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestBodyError(413, f"body of {declared} bytes exceeds {limit} (max_request_bytes)")
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "gzip", ""):
        raise RequestBodyError(400, f"Content-Encoding {encoding!r} unsupported; use gzip or none")
    inflater = Inflater(settings.max_inflated_bytes) if encoding == "gzip" else None
    raw = bytearray()
    received = 0
    async for chunk in chunks:
        received += len(chunk)
        if received > limit:
            raise RequestBodyError(413, f"body exceeds {limit} bytes (max_request_bytes)")
        if inflater is not None:
            inflater.feed(chunk)
        else:
            raw += chunk
    if inflater is not None:
        return inflater.finish() if received else b""
    return bytes(raw)


async def read_model(request: Request, settings: BrokerSettings, model: type[ModelT]) -> ModelT:
    """A small body parsed into its protocol model; errors answer 422 naming the field."""
    body = await read_body(request, settings)
    data = codec.decode(body, request.headers.get("content-type")) if body else None
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise RequestValidationError(err.errors(include_url=False)) from err


def encoded(request: Request, payload: Any, status_code: int = 200) -> Response:
    """Answer in the encoding the client accepts (msgpack when asked, JSON otherwise)."""
    body, media_type = codec.encode(payload, request.headers.get("accept"))
    return Response(body, status_code=status_code, media_type=media_type)
