"""What every HTTP server of atroposlib (broker, inference) shares: bearer-token auth and
the 422 answer to a body that does not validate."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

from fastapi import HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError

from atroposlib import codec

UNAUTHORIZED_DETAIL = "missing or wrong bearer token; send 'Authorization: Bearer <api_key>'"
UNAUTHORIZED_HEADERS = {"WWW-Authenticate": "Bearer"}


def bearer_header_ok(header: str, api_key: str) -> bool:
    """``header`` as ASGI servers decode it (latin-1), so any byte compares, none raises.

    >>> bearer_header_ok("Bearer s3cret", "s3cret"), bearer_header_ok("bearer  s3cret ", "s3cret")
    (True, True)
    >>> bearer_header_ok("s3cret", "s3cret"), bearer_header_ok("Bearer s3cr\\xe9t", "s3cret")
    (False, False)
    """
    scheme, _, token = header.partition(" ")
    wire = token.strip().encode("latin-1", errors="replace")
    return scheme.lower() == "bearer" and secrets.compare_digest(wire, api_key.encode())


def require_bearer(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    """The FastAPI dependency: 401 (``{"detail": ...}``, ``WWW-Authenticate: Bearer``) unless
    the request carries ``Authorization: Bearer <api_key>``; no check when ``api_key`` is None."""

    async def check(request: Request) -> None:
        if api_key is None:
            return
        if not bearer_header_ok(request.headers.get("authorization", ""), api_key):
            raise HTTPException(401, UNAUTHORIZED_DETAIL, headers=UNAUTHORIZED_HEADERS)

    return check


def validation_answer(err: RequestValidationError) -> Response:
    """422 naming each field; the offending input is left out (NaN, bytes, ... are not JSON,
    and a huge body should not come back)."""
    detail = [
        {"loc": list(error.get("loc", ())), "msg": str(error.get("msg")), "type": error.get("type")}
        for error in err.errors()
    ]
    return Response(codec.dumps_json({"detail": detail}), 422, media_type="application/json")
