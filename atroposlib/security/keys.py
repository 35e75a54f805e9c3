"""Bearer keys: checking one on a request, generating one for a run, refusing an empty one."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

from fastapi import HTTPException, Request

UNAUTHORIZED_DETAIL = "missing or wrong bearer token; send 'Authorization: Bearer <api_key>'"
ADMIN_DETAIL = (
    "missing or wrong admin bearer token; this route needs 'Authorization: Bearer "
    "<admin_api_key>' (the run's api_key when no admin_api_key is set)"
)
UNAUTHORIZED_HEADERS = {"WWW-Authenticate": "Bearer"}
KEY_VARIABLE = "ATROPOS_API_KEY"
"""The run key's variable: launchers give it to every process of the run (sampling, groups)."""
ADMIN_KEY_VARIABLE = "ATROPOS_ADMIN_API_KEY"
"""The admin key's variable on every server: launchers give it to the servers and the trainer
only (weights, pause/resume, LoRA, the trainer's broker routes, everyone's sessions)."""

Keys = str | tuple[str, ...] | None
"""The keys a route accepts: one, any of several, or None (and ``()``): no check."""


def new_key() -> str:
    """A fresh run key: 256 random bits, URL-safe (what ``atropos-local`` hands out)."""
    return secrets.token_urlsafe(32)


def bearer_header_ok(header: str, api_key: str) -> bool:
    """``header`` as ASGI servers decode it (latin-1), so any byte compares, none raises.

    >>> bearer_header_ok("Bearer s3cret", "s3cret"), bearer_header_ok("bearer  s3cret ", "s3cret")
    (True, True)
    >>> bearer_header_ok("s3cret", "s3cret"), bearer_header_ok("Bearer s3cr\\xe9t", "s3cret")
    (False, False)
    >>> bearer_header_ok("Bearer ", "")  # an empty key never opens anything
    False
    """
    scheme, _, token = header.partition(" ")
    wire = token.strip().encode("latin-1", errors="replace")
    if not api_key or scheme.lower() != "bearer":
        return False
    return secrets.compare_digest(wire, api_key.encode())


def bearer_matches(header: str, keys: Keys) -> bool:
    """Whether ``header`` carries one of ``keys`` (False when there is none).

    >>> bearer_matches("Bearer admin", ("run", "admin")), bearer_matches("Bearer run", "admin")
    (True, False)
    """
    accepted = (keys,) if isinstance(keys, str) else keys or ()
    return any(bearer_header_ok(header, key) for key in accepted)


def non_empty_key(value: str | None, field: str, variable: str = KEY_VARIABLE) -> str | None:
    """``value`` unless it is empty or blank: a start-up error naming the fix (and ``variable``,
    the environment variable the key usually comes from).

    >>> non_empty_key(None, "api_key") is None, non_empty_key("k", "api_key")
    (True, 'k')
    >>> non_empty_key(" ", "api_key")
    Traceback (most recent call last):
    ...
    ValueError: api_key is set but empty (ATROPOS_API_KEY= from a failed $(cat ...)?); ...
    """
    if value is not None and not value.strip():
        raise ValueError(
            f"{field} is set but empty ({variable}= from a failed $(cat ...)?); an empty "
            f"key would open the server to anyone: set a real key or unset the variable"
        )
    return value


def require_bearer(
    api_key: Keys, detail: str = UNAUTHORIZED_DETAIL
) -> Callable[[Request], Awaitable[None]]:
    """The FastAPI dependency: 401 (``{"detail": ...}``, ``WWW-Authenticate: Bearer``) unless
    the request carries ``Authorization: Bearer <key>`` with one of ``api_key``; no check when
    there is no key (None or ``()``)."""

    async def check(request: Request) -> None:
        if not api_key:
            return
        if not bearer_matches(request.headers.get("authorization", ""), api_key):
            raise HTTPException(401, detail, headers=UNAUTHORIZED_HEADERS)

    return check
