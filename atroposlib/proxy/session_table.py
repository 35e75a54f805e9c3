"""The proxy's open sessions, and the inference server each new one is pinned to."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from atroposlib.proxy.session import ProxySession

logger = logging.getLogger(__name__)


class ServerChoiceError(Exception):
    """No inference server fits a new session; ``status_code`` is the HTTP answer."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code


def base_url_of(server: Any) -> str | None:
    url = getattr(getattr(server, "config", None), "base_url", None)
    return str(url) if url else None


def _records_tokens(server: Any) -> bool:
    """False only for servers that say they return no token ids (``server_type: openai``)."""
    return getattr(server, "supports_token_ids", True) is not False


def _free_slots(server: Any) -> int:
    """Training slots free now; 0 for a server that cannot say (a test double's config)."""
    try:
        return int(server.free_slots("train"))
    except AttributeError:
        return 0


class SessionTable:
    """Sessions by id, at most ``max_sessions``; sessions idle past ``idle_timeout_s`` are
    closed when a new one is added (an agent that crashed never deletes its session)."""

    def __init__(
        self,
        server_manager: Any,
        max_sessions: int,
        idle_timeout_s: float,
        clock: Callable[[], float] = time.time,
        max_per_client: int | None = None,
    ) -> None:
        self.server_manager = server_manager
        self.max_sessions = max_sessions
        self.max_per_client = max_per_client or max_sessions
        self.idle_timeout_s = idle_timeout_s
        self.clock = clock
        self._sessions: dict[str, ProxySession] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def servers(self) -> list[Any]:
        return list(self.server_manager.servers)

    def get(self, session_id: str) -> ProxySession | None:
        return self._sessions.get(session_id)

    def pop(self, session_id: str) -> ProxySession | None:
        return self._sessions.pop(session_id, None)

    def sessions(self) -> list[ProxySession]:
        return list(self._sessions.values())

    def add(self, session: ProxySession) -> bool:
        """Whether ``session`` was added (False: :meth:`limit_reached` names why not)."""
        if self.limit_reached(session.client) is not None:
            return False
        self._sessions[session.uuid] = session
        return True

    def limit_reached(self, client: str) -> str | None:
        """The limit a new session of ``client`` would pass, idle sessions closed first:
        ``max_sessions`` (the table is full of active ones) or ``max_sessions_per_client``."""
        self.close_idle()
        if len(self._sessions) >= self.max_sessions:
            return "max_sessions"
        if self.open_by(client) >= self.max_per_client:
            return "max_sessions_per_client"
        return None

    def open_by(self, client: str) -> int:
        return sum(1 for s in self._sessions.values() if s.client == client)

    def close_idle(self) -> None:
        deadline = self.clock() - self.idle_timeout_s
        idle = [s for s in self._sessions.values() if s.last_accessed < deadline]
        for session in idle:
            del self._sessions[session.uuid]
            logger.warning(
                "closed proxy session %s: idle for over %.0f s with %d node(s) never collected",
                session.uuid, self.idle_timeout_s, len(session.recorder.nodes),
            )  # fmt: skip

    def base_url_of(self, server: Any) -> str | None:
        return base_url_of(server)

    def pick_server(self, base_url: str | None) -> Any:
        """The server at ``base_url``, else the healthy token server with most free slots."""
        servers = self.servers
        if base_url is not None:
            wanted = base_url.rstrip("/")
            match = [s for s in servers if (base_url_of(s) or "").rstrip("/") == wanted]
            if not match:
                known = [base_url_of(s) for s in servers if base_url_of(s)]
                raise ServerChoiceError(404, f"base_url: no server {base_url!r}; known: {known}")
            server = match[0]
            if not _records_tokens(server):
                raise ServerChoiceError(409, _no_tokens(server))
            return server
        usable = [s for s in servers if _records_tokens(s)]
        if not usable:
            raise ServerChoiceError(409, _no_tokens(servers[0]) if servers else "no servers")
        healthy = [s for s in usable if getattr(s, "server_healthy", True)] or usable
        return max(healthy, key=_free_slots)

    def spare_for(self, failed: Any) -> Any | None:
        """Where a session moves when ``failed`` fails: the healthy token server other than it
        with most free slots, else None."""
        others = [s for s in self.servers if s is not failed and _records_tokens(s)]
        healthy = [s for s in others if getattr(s, "server_healthy", True) and not _dead(s)]
        return max(healthy, key=_free_slots) if healthy else None


def _dead(server: Any) -> bool:
    return getattr(server, "dead", None) is not None


def _no_tokens(server: Any) -> str:
    kind = getattr(getattr(server, "config", None), "server_type", "unknown")
    return (
        f"base_url: {base_url_of(server)!r} (server_type {kind}) returns no token ids, and a "
        "session records the exact ids for training; use server_type vllm, sglang or embedded"
    )
