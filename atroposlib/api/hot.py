"""The per-group routes (``POST /scored_data``, ``POST /scored_data_list``, ``GET /batch``).

Every rollout group and every batch passes through these three, so they are served straight
from ASGI by :class:`HotRoutes`: no Request object, no middleware stack, no dependency solving
(the whole stack cost ~40% of a small POST's CPU in benchmarks/broker_request_overhead.py).
They answer exactly what the FastAPI routes of the same paths answer; those stay in the app
for the OpenAPI schema and for setups the direct path leaves to the full stack (CORS).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import orjson
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from atroposlib import codec
from atroposlib.api.broker import Broker
from atroposlib.api.compression import Gzipper, accepts_gzip
from atroposlib.api.fastjson import decode_groups
from atroposlib.api.http import read_body_chunks
from atroposlib.api.metrics import BrokerMetrics
from atroposlib.api.openapi import request_body
from atroposlib.api.settings import BrokerSettings
from atroposlib.bounds import MAX_STEP
from atroposlib.errors import (
    InvalidGroupError,
    RequestBodyError,
    RetryLaterError,
    TrainerNotRegisteredError,
    UnknownEnvError,
)
from atroposlib.security import (
    ADMIN_DETAIL,
    UNAUTHORIZED_DETAIL,
    UNAUTHORIZED_HEADERS,
    BrowserGuard,
    bearer_matches,
)
from atroposlib.wire.broker import (
    BatchResponse,
    ScoredData,
    ScoredDataListResponse,
    ScoredDataResponse,
)

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Answer:
    status: int
    body: bytes
    media_type: str
    headers: dict[str, str] = field(default_factory=dict)


BROKER_ERRORS: dict[type[Exception], int] = {
    InvalidGroupError: 422,
    UnknownEnvError: 404,
    TrainerNotRegisteredError: 409,
    RetryLaterError: 503,
    RequestBodyError: 400,  # its own status_code (400 or 413) is used
}
"""The broker's own errors and their HTTP status; anything else is a 500."""


def error_answer(err: Exception) -> Answer | None:
    """The HTTP answer of one of the broker's own errors (None for anything else)."""
    status = next((code for kind, code in BROKER_ERRORS.items() if isinstance(err, kind)), None)
    if status is None:
        return None
    detail, headers = str(err), {}
    if isinstance(err, RetryLaterError):
        headers["Retry-After"] = str(err.retry_after)
    elif isinstance(err, RequestBodyError):
        status, detail = err.status_code, err.message
    return Answer(status, orjson.dumps({"detail": detail}), "application/json", headers)


def forbidden_answer(reason: str) -> Answer:
    return Answer(403, orjson.dumps({"detail": reason}), "application/json")


def unauthorized_answer(detail: str = UNAUTHORIZED_DETAIL) -> Answer:
    body = orjson.dumps({"detail": detail})
    return Answer(401, body, "application/json", dict(UNAUTHORIZED_HEADERS))


Handler = Callable[[Mapping[str, str], bytes, str], Coroutine[Any, Any, Answer]]
"""A hot route: (lower-case headers, body, query string) -> answer."""


_RECEIVED_QUERY = {
    "parameters": [
        {
            "name": "received", "in": "query", "required": False,
            "description": "The last step this (acknowledging) trainer received.",
            "schema": {"type": "integer", "minimum": 0, "maximum": MAX_STEP},
        }
    ]
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class HotRoute:
    """A per-group route declared once: the raw ASGI path and the FastAPI route (with its
    OpenAPI entry: ``openapi_extra`` and ``response_model``) are both built from it."""

    method: str
    path: str
    handler: Handler
    response_model: type[BaseModel]
    openapi_extra: dict[str, Any]
    admin: bool = False
    """The trainer's route: it needs the admin key (the run key when there is none)."""


class HotRoutes:
    """The three routes' logic, and a raw ASGI server for them."""

    def __init__(
        self, broker: Callable[[], Broker], settings: BrokerSettings, metrics: BrokerMetrics
    ) -> None:
        self._broker = broker
        self._settings = settings
        self._metrics = metrics
        self._gzipper = Gzipper(minimum_size=1000, gzip_level=settings.gzip_level)
        self.guard = BrowserGuard(settings)
        self.declared = (
            HotRoute("GET", "/batch", self.batch, BatchResponse, _RECEIVED_QUERY, admin=True),
            HotRoute(
                "POST", "/scored_data", self.scored_data, ScoredDataResponse,
                request_body(ScoredData, "One scored group."),
            ),
            HotRoute(
                "POST", "/scored_data_list", self.scored_data_list, ScoredDataListResponse,
                request_body(list[ScoredData], "Scored groups, queued all or none."),
            ),
        )  # fmt: skip
        self.routes: dict[tuple[str, str], HotRoute] = {
            (route.method, route.path): route for route in self.declared
        }

    # -- the routes ---------------------------------------------------------------------

    async def batch(self, headers: Mapping[str, str], _: bytes, query: str) -> Answer:
        started = time.perf_counter()
        accept = headers.get("accept")
        received = _received_step(query) if query else None
        formed = self._broker().next_batch(packed=codec.is_msgpack(accept), received=received)
        self._metrics.batch_seconds.observe(time.perf_counter() - started)
        if formed is None:
            return _encoded({"batch": None, "step": None}, accept)
        step, groups = formed
        answer = _encoded({"batch": groups, "step": step}, accept)
        self._metrics.bytes_out.inc(len(answer.body))
        return answer

    async def scored_data(self, headers: Mapping[str, str], body: bytes, _: str) -> Answer:
        raw = self._decode(headers, body)
        result = self._broker().ingest([raw])
        answer = ScoredDataResponse(duplicate=result.duplicates > 0)
        return _encoded(answer.model_dump(), headers.get("accept"))

    async def scored_data_list(self, headers: Mapping[str, str], body: bytes, _: str) -> Answer:
        raws = self._decode(headers, body)
        if not isinstance(raws, list):
            raise InvalidGroupError("body", "must be a JSON array of groups")
        result = self._broker().ingest(raws, as_list=True)
        answer = ScoredDataListResponse(groups_processed=len(raws), duplicates=result.duplicates)
        return _encoded(answer.model_dump(), headers.get("accept"))

    def _decode(self, headers: Mapping[str, str], body: bytes) -> Any:
        self._metrics.bytes_in.inc(len(body))
        content_type = headers.get("content-type")
        if not codec.is_msgpack(content_type):
            fast = decode_groups(body)
            if fast is not None:
                return fast
        return codec.decode(body, content_type)

    # -- raw ASGI -----------------------------------------------------------------------

    async def serve(self, route: HotRoute, scope: Scope, receive: Receive, send: Send) -> None:
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
        settings = self._settings
        keys = settings.admin_key if route.admin else settings.run_keys
        try:
            if keys and not bearer_matches(headers.get("authorization", ""), keys):
                answer = unauthorized_answer(ADMIN_DETAIL if route.admin else UNAUTHORIZED_DETAIL)
            elif (refusal := self.guard.refusal(headers)) is not None:
                answer = forbidden_answer(refusal)
            else:
                body = b""
                if scope["method"] == "POST":
                    body = await read_body_chunks(headers, _chunks(receive), self._settings)
                query = scope["query_string"].decode("latin-1")
                answer = await route.handler(headers, body, query)
        except _Disconnected:
            return
        except Exception as err:
            known = error_answer(err)
            if known is None:
                logger.exception("%s %s failed", scope["method"], scope["path"])
                known = Answer(500, b'{"detail":"Internal Server Error"}', "application/json")
            answer = known
        await self._send(answer, headers, send)

    async def _send(self, answer: Answer, headers: Mapping[str, str], send: Send) -> None:
        body = answer.body
        media = answer.media_type.encode("latin-1")
        extra = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers.items()
        ]
        if self._gzipper.applies(len(body), media) and accepts_gzip(headers.get("accept-encoding")):
            body = await self._gzipper.compress(body)
            extra += [(b"content-encoding", b"gzip"), (b"vary", b"Accept-Encoding")]
        start_headers = [
            (b"content-type", media),
            (b"content-length", str(len(body)).encode("latin-1")),
            *extra,
        ]
        await send(
            {"type": "http.response.start", "status": answer.status, "headers": start_headers}
        )
        await send({"type": "http.response.body", "body": body})


class _Disconnected(Exception):
    """The client went away before its request body arrived."""


async def _chunks(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


def _received_step(query: str) -> int | None:
    """``received=<step>`` of ``GET /batch``: the last batch step the trainer got (see Broker)."""
    values = parse_qs(query, keep_blank_values=True).get("received")
    if not values:
        return None
    text = values[-1].strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 16 and int(text) <= MAX_STEP):
        raise InvalidGroupError(
            "received", f"must be an integer step between 0 and {MAX_STEP}, got {text[:40]!r}"
        )
    return int(text)


def _encoded(payload: Any, accept: str | None) -> Answer:
    body, media_type = codec.encode(payload, accept)
    return Answer(200, body, media_type)
