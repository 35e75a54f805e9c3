"""Reading an HTTP answer as JSON (Atropos 0.4's helper; works with aiohttp and httpx)."""

from __future__ import annotations

import inspect
import logging
from typing import Any

_logger = logging.getLogger(__name__)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def parse_http_response(resp: Any, logger: logging.Logger | None = None) -> Any:
    """``resp.raise_for_status()`` then its JSON; on failure log the status and body, re-raise."""
    log = logger or _logger
    try:
        resp.raise_for_status()
        return await _maybe_await(resp.json())
    except Exception as error:
        body = await _maybe_await(resp.text()) if callable(resp.text) else resp.text
        status = getattr(error, "status", getattr(resp, "status_code", "unknown"))
        log.error("error fetching from server: status %s, %s; response: %.500s", status,
                  getattr(error, "message", str(error)), body)  # fmt: skip
        raise
