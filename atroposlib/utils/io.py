"""Reading an HTTP answer as JSON (Atropos 0.4's helper; works with aiohttp and httpx)."""

from __future__ import annotations

import inspect
import logging
from typing import Any

_logger = logging.getLogger(__name__)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _body_for_log(resp: Any) -> str:
    try:
        return str(await _maybe_await(resp.text()) if callable(resp.text) else resp.text)
    except Exception as error:  # the failure being reported matters more than its body
        return f"<body unreadable: {type(error).__name__}: {error}>"


async def parse_http_response(resp: Any, logger: logging.Logger | None = None) -> Any:
    """``resp.raise_for_status()`` then its JSON; on failure log the status and body, re-raise
    that failure. The body may be gone (aiohttp's ``raise_for_status`` releases the connection
    of a response opened without ``async with``): then the log says so, and the HTTP error, not
    the failed read, is what the caller's retries see (Atropos 0.4 raised the read's
    connection error instead, with no status: its PR #484)."""
    log = logger or _logger
    try:
        resp.raise_for_status()
        return await _maybe_await(resp.json())
    except Exception as error:
        body = await _body_for_log(resp)
        status = getattr(error, "status", getattr(resp, "status_code", "unknown"))
        log.error("error fetching from server: status %s, %s; response: %.500s", status,
                  getattr(error, "message", str(error)), body)  # fmt: skip
        raise
