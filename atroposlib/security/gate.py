"""The key check a server runs before its app: key before body, and the schema routes.

FastAPI reads and parses a route's body before it runs the route's dependencies, so a key
checked by ``Depends(require_bearer(...))`` costs the server a whole body (up to the body
limit, or a connection held open by one that never ends) before it refuses. The gate is pure
ASGI: it reads the ``Authorization`` header and answers 401 without ever calling ``receive``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from atroposlib.security.keys import (
    ADMIN_DETAIL,
    UNAUTHORIZED_DETAIL,
    UNAUTHORIZED_HEADERS,
    Keys,
    bearer_matches,
)

logger = logging.getLogger(__name__)

SCHEMA_PATHS = frozenset(("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"))


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused before its body: its status and ``detail``."""

    status: int
    detail: str


Authorize = Callable[[str, str, str], Refusal | None]
"""``(method, path, Authorization header) -> Refusal | None`` (None: the request goes on)."""
ErrorBody = Callable[[int, str], bytes]
"""A refusal's JSON body from its status and detail (a server's own error shape)."""


def detail_body(status: int, detail: str) -> bytes:
    return orjson.dumps({"detail": detail})


def unauthorized(detail: str = UNAUTHORIZED_DETAIL) -> Refusal:
    return Refusal(401, detail)


class RouteKeys:
    """Which keys each path takes: ``open_paths`` none, ``admin_paths`` the admin key, every
    other path (the schema routes and unknown paths too) the run keys (the settings'
    ``run_keys``: the run key or the admin key). No key opens its paths, as
    :func:`~atroposlib.security.keys.require_bearer` does.

    >>> keys = RouteKeys(("run", "admin"), "admin", open_paths=["/health"], admin_paths=["/pause"])
    >>> keys("GET", "/health", ""), keys("POST", "/generate", "Bearer admin")
    (None, None)
    >>> keys("POST", "/generate", "Bearer x").status, keys("POST", "/pause", "Bearer run")
    (401, Refusal(status=401, detail="missing or wrong admin bearer token; ..."))
    >>> RouteKeys(())("POST", "/generate", "") is None  # no key: open, as on loopback
    True
    """

    def __init__(
        self,
        run_keys: Keys,
        admin_key: Keys = None,
        open_paths: Collection[str] = (),
        admin_paths: Collection[str] = (),
    ) -> None:
        self.run_keys = run_keys
        self.admin_key = admin_key
        self.open_paths = frozenset(open_paths)
        self.admin_paths = frozenset(admin_paths)

    def __call__(self, method: str, path: str, authorization: str) -> Refusal | None:
        if path in self.open_paths:
            return None
        if path in self.admin_paths:
            keys, detail = self.admin_key, ADMIN_DETAIL
        else:
            keys, detail = self.run_keys, UNAUTHORIZED_DETAIL
        if not keys or bearer_matches(authorization, keys):
            return None
        return unauthorized(detail)


class KeyFirstMiddleware:
    """ASGI middleware: the refusal ``authorize`` names, answered before the body is read."""

    def __init__(
        self, app: ASGIApp, authorize: Authorize, error_body: ErrorBody = detail_body
    ) -> None:
        self.app = app
        self.authorize = authorize
        self.error_body = error_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = next(
                (v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"authorization"),
                "",
            )
            refusal = self.authorize(scope["method"], scope["path"], header)
            if refusal is not None:
                logger.info("%s %s refused (%d) before its body", scope["method"],
                            scope["path"][:200], refusal.status)  # fmt: skip
                await self._refuse(send, refusal)
                return
        await self.app(scope, receive, send)

    async def _refuse(self, send: Send, refusal: Refusal) -> None:
        body = self.error_body(refusal.status, refusal.detail)
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]  # fmt: skip
        if refusal.status == 401:
            headers += [(k.lower().encode(), v.encode()) for k, v in UNAUTHORIZED_HEADERS.items()]
        await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def mount_key_first(
    app: FastAPI, authorize: Authorize, error_body: ErrorBody = detail_body
) -> None:
    """Put the gate on ``app``. Call it before ``mount_guard``, so that CORS (outside it)
    answers preflights, which carry no key, and adds its headers to the gate's 401s."""
    app.add_middleware(KeyFirstMiddleware, authorize=authorize, error_body=error_body)


def schema_routes(expose: bool) -> dict[str, Any]:
    """FastAPI's keywords for ``/openapi.json``, ``/docs`` and ``/redoc``: all off unless the
    operator asked for them (``--expose-api-docs``); the gate then asks them for the key."""
    if expose:
        return {"openapi_url": "/openapi.json", "docs_url": "/docs", "redoc_url": "/redoc"}
    return {"openapi_url": None, "docs_url": None, "redoc_url": None}
