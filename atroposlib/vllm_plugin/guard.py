"""The bearer keys and browser guard of a vLLM (or SGLang) server that we start, as a middleware.

vLLM's ``--api-key`` covers its ``/v1`` routes only; with ``VLLM_SERVER_DEV_MODE`` (which the
RL routes need) ``/pause``, ``/update_weights``, ``/collective_rpc``, ``/update_weight_version``
and their kin answer anyone who reaches the port. Serve with
``--middleware atroposlib.vllm_plugin.guard.VllmGuard``: vLLM adds the class around its app
(``app.add_middleware(cls)``, so it takes the app alone) and every request then passes through
the checks our own servers make (:mod:`atroposlib.security`), read from the environment:

- ``ATROPOS_API_KEY`` (the run key): every route but ``/health``, ``/ping``, ``/metrics`` and
  ``/version`` needs ``Authorization: Bearer <key>`` (401 otherwise; an empty value stops vLLM
  at start-up);
- ``ATROPOS_ADMIN_API_KEY``: when set, it opens every route, and it alone opens those outside
  sampling (:data:`RUN_PATHS`): weights, ``/pause``, ``/collective_rpc``, LoRA loading,
  ``/tokenizer_info``, sleep/wake, ``/reset_prefix_cache`` and whatever vLLM adds. Set alone,
  every route needs it;
- without a key, requests that reach vLLM over anything but loopback are refused (403) unless
  ``ATROPOS_INSECURE_NO_KEY=1``, and the browser guard refuses cross-site and DNS-rebinding
  requests (names besides IPs, ``localhost`` and this machine's in ``ATROPOS_ALLOWED_HOSTS``,
  comma-separated).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from atroposlib.security.access import AccessSettings
from atroposlib.security.guard import BrowserGuard, is_loopback, refuse, request_headers
from atroposlib.security.keys import (
    ADMIN_DETAIL,
    ADMIN_KEY_VARIABLE,
    KEY_VARIABLE,
    UNAUTHORIZED_DETAIL,
    UNAUTHORIZED_HEADERS,
    bearer_matches,
)

logger = logging.getLogger(__name__)

INSECURE_VARIABLE = "ATROPOS_INSECURE_NO_KEY"
HOSTS_VARIABLE = "ATROPOS_ALLOWED_HOSTS"
OPEN_PATHS = frozenset(("/health", "/ping", "/metrics", "/version"))
RUN_PATHS = frozenset((
    "/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/responses",
    "/v1/embeddings", "/v1/score", "/v1/rerank", "/v1/realtime", "/tokenize", "/detokenize",
    "/inference/v1/generate", "/generate", "/weight_info", "/get_weight_version", "/is_paused",
    "/get_model_info", "/health_generate",
))  # fmt: skip
"""What the run key opens besides the open paths: sampling and reading. Every other route is
the admin key's, so a route a new vLLM adds is closed to the run key until listed here."""
RUN_PREFIXES = ("/v1/models/", "/v1/responses/")
NETWORK_DETAIL = (
    "this vLLM has no key and serves only loopback: set ATROPOS_API_KEY (and send it as "
    f"'Authorization: Bearer <key>'), or {INSECURE_VARIABLE}=1 to serve the network open"
)


def settings_from(environ: Mapping[str, str]) -> AccessSettings:
    """The guard's settings from ``environ``; ValueError on an empty key."""
    insecure = environ.get(INSECURE_VARIABLE, "").strip().lower() in ("1", "true", "yes")
    hosts = [h.strip() for h in environ.get(HOSTS_VARIABLE, "").split(",") if h.strip()]
    return AccessSettings(
        # the bind address is vLLM's; loopback here keeps the browser guard's strict names,
        # an open run (insecure) accepts any Host as our servers do on a network address
        host="0.0.0.0" if insecure else "127.0.0.1",
        api_key=environ.get(KEY_VARIABLE),
        admin_api_key=environ.get(ADMIN_KEY_VARIABLE),
        insecure_no_key=insecure,
        allowed_hosts=hosts,
    )


class VllmGuard:
    """ASGI middleware: key, admin key, loopback-only without a key, browser guard."""

    def __init__(self, app: ASGIApp, environ: Mapping[str, str] | None = None) -> None:
        self.app = app
        self.settings = settings_from(os.environ if environ is None else environ)
        self.browser = BrowserGuard(self.settings)
        if not self.settings.run_keys:
            logger.warning(
                "vLLM guard without %s: %s", KEY_VARIABLE,
                "open to everyone (insecure)" if self.settings.insecure_no_key
                else "only requests over loopback are served",
            )  # fmt: skip

    def refusal(
        self, path: str, headers: Mapping[str, str], server: tuple[str, int] | None
    ) -> tuple[int, str] | None:
        """The status and detail refusing a request; None when it may go on."""
        if path in OPEN_PATHS:
            return None
        settings = self.settings
        if not settings.run_keys:
            if server is not None and not settings.insecure_no_key and not is_loopback(server[0]):
                return 403, NETWORK_DETAIL
            browser = self.browser.refusal(headers)
            return None if browser is None else (403, browser)
        header = headers.get("authorization", "")
        if bearer_matches(header, settings.admin_key):
            return None
        if path in RUN_PATHS or path.startswith(RUN_PREFIXES):
            return None if bearer_matches(header, settings.run_keys) else (401, UNAUTHORIZED_DETAIL)
        return 401, ADMIN_DETAIL

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)  # lifespan; CORS preflights change nothing
            return
        server = scope.get("server")  # the address the request reached; None: a unix socket
        where = None if server is None else (str(server[0]), int(server[1]))
        verdict = self.refusal(scope["path"], request_headers(scope), where)
        if verdict is None:
            await self.app(scope, receive, send)
            return
        status, detail = verdict
        logger.warning("%s %s refused (%d): %s", scope.get("method", kind), scope["path"],
                       status, detail)  # fmt: skip
        if kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            await refuse(send, status, detail, UNAUTHORIZED_HEADERS if status == 401 else None)
