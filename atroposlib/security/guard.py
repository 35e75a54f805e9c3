"""Refuse what a web browser sends on another site's behalf: CSRF and DNS rebinding.

Without an API key, any page a user visits could make their browser call the broker on
localhost (an ``<img src=".../reset_data">`` wipes the queue), and a domain that resolves to
127.0.0.1 turns such calls into same-origin ones. Browsers mark both: ``Sec-Fetch-Site`` and
``Origin`` name the calling site, ``Host`` the name the page used. Trainers, environments and
tools (Atropos's included) send neither of the first two and reach a server bound to loopback
by an IP address, ``localhost``, a single-label name (resolved by this machine or its site,
never by the public DNS a rebinding page controls) or this machine's name, so they pass
untouched. With an API key a browser cannot send the key on another site's behalf, and nothing
here applies. Every server of ours (broker, inference, proxy) mounts this one guard.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Mapping
from typing import Protocol
from urllib.parse import urlsplit

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send


class GuardedServer(Protocol):
    """What the guard reads of a server's settings (``AccessSettings`` has them)."""

    host: str
    api_key: str | None
    admin_api_key: str | None
    allowed_hosts: list[str]
    cors_origins: list[str]


logger = logging.getLogger(__name__)

_FOREIGN_FETCH = frozenset(("cross-site", "same-site"))  # same-site: another port, same host
_VERDICTS_KEPT = 256  # Host values remembered (a client uses one or two)


def _hostname(authority: str) -> str:
    """``host[:port]`` (or ``[v6]:port``) -> lower-case host without brackets or port."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        return authority[1 : authority.find("]")] if "]" in authority else authority
    return authority.rsplit(":", 1)[0] if authority.count(":") == 1 else authority


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    name = _hostname(host)
    return name == "localhost" or (_is_ip(name) and ipaddress.ip_address(name).is_loopback)


def machine_names() -> set[str]:
    """This machine's names (short and qualified), as clients on a cluster use them."""
    names = {socket.gethostname(), socket.getfqdn()}
    return {n.lower() for name in names for n in (name, name.split(".")[0]) if n}


class BrowserGuard:
    """Decides, from a request's headers alone, whether a browser sent it for another site."""

    def __init__(self, settings: GuardedServer) -> None:
        self.enabled = settings.api_key is None and settings.admin_api_key is None
        allowed = settings.allowed_hosts
        # Bound to a network address, the server is open to that network anyway (with
        # docker/k8s service names in Host): there --api-key is the protection.
        self._any_host = "*" in allowed or not is_loopback(settings.host)
        self._hosts = {h.lower() for h in allowed} | machine_names() | {_hostname(settings.host)}
        self._origins = {origin.rstrip("/").lower() for origin in settings.cors_origins}
        self._host_verdicts: dict[str, bool] = {}

    def _host_ok(self, host: str) -> bool:
        known = self._host_verdicts.get(host)
        if known is not None:
            return known
        name = _hostname(host)
        verdict = (
            self._any_host
            or name in self._hosts
            or name == "localhost"
            or name.endswith(".localhost")
            or "." not in name
            or _is_ip(name)
        )
        if len(self._host_verdicts) < _VERDICTS_KEPT:
            self._host_verdicts[host] = verdict
        return verdict

    def refusal(self, headers: Mapping[str, str]) -> str | None:
        """Why the request is refused (lower-case ``headers``); None when it may go on."""
        if not self.enabled:
            return None
        host = headers.get("host", "")
        if host and not self._host_ok(host):
            return (
                f"Host {host[:100]!r} is not a name of this server (a DNS-rebinding page?); "
                "reach it by IP address, localhost or this machine's name, or add the name "
                "to --allowed-hosts"
            )
        origin = headers.get("origin")
        if origin is not None and origin.rstrip("/").lower() not in self._origins:
            if urlsplit(origin).netloc.lower() != host.lower() or not host:
                return (
                    f"cross-site request from {origin[:100]!r} refused; list the origin in "
                    "--cors-origins or set --api-key"
                )
        elif headers.get("sec-fetch-site", "").lower() in _FOREIGN_FETCH and origin is None:
            return "cross-site request from a web page refused; set --api-key to share the server"
        return None


class BrowserGuardMiddleware:
    """ASGI middleware answering 403 to what :class:`BrowserGuard` refuses."""

    def __init__(self, app: ASGIApp, guard: BrowserGuard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.guard.enabled:
            refusal = self.guard.refusal(request_headers(scope))
            if refusal is not None:
                logger.warning("%s %s refused: %s", scope["method"], scope["path"], refusal)
                await refuse(send, 403, refusal)
                return
        await self.app(scope, receive, send)


def request_headers(scope: Scope) -> dict[str, str]:
    """A request's headers, lower-case names, the first of each (as ASGI servers decode them)."""
    headers: dict[str, str] = {}
    for name, value in scope["headers"]:
        headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return headers


async def refuse(
    send: Send, status: int, detail: str, headers: Mapping[str, str] | None = None
) -> None:
    """Answer ``{"detail": detail}`` with ``status`` (and ``headers``) without calling the app."""
    body = orjson.dumps({"detail": detail})
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    start = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": start + extra})
    await send({"type": "http.response.body", "body": body})
