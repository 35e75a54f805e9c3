"""What every HTTP server of atroposlib (broker, inference, proxy) shares besides its guard
(:mod:`atroposlib.security`): the 422 answer to a body that does not validate."""

from __future__ import annotations

from fastapi import Response
from fastapi.exceptions import RequestValidationError

from atroposlib import codec


def validation_answer(err: RequestValidationError) -> Response:
    """422 naming each field; the offending input is left out (NaN, bytes, ... are not JSON,
    and a huge body should not come back)."""
    detail = [
        {"loc": list(error.get("loc", ())), "msg": str(error.get("msg")), "type": error.get("type")}
        for error in err.errors()
    ]
    return Response(codec.dumps_json({"detail": detail}), 422, media_type="application/json")
