"""Who may call which route of the managed-server proxy, decided before a body is read.

A keyed proxy (a run or admin key set; the one an environment starts always is) asks:

- ``GET /health``: nothing;
- ``GET /sessions`` (every session's id): the admin key;
- ``POST /sessions/create``, ``/v1/models``, ``/servers`` (and the schema routes when
  exposed): the proxy's key (or its admin key);
- ``/{id}/...`` (chat, render, nodes, delete): that session's own token, returned once by
  ``/sessions/create``. The proxy's key without it gets 404, as for an id that is not open,
  so a key holder can neither read nor extend nor close another client's session.

Without any key (a proxy run open on loopback, as Atropos's was) nothing asks for a key and
a session id is enough to use its session.
"""

from __future__ import annotations

import secrets

from atroposlib.proxy.session_table import SessionTable
from atroposlib.security.gate import SCHEMA_PATHS, Refusal, unauthorized
from atroposlib.security.keys import (
    ADMIN_DETAIL,
    UNAUTHORIZED_DETAIL,
    Keys,
    bearer_header_ok,
    bearer_matches,
)

SERVICE_PATHS = frozenset(("/sessions/create", "/v1/models", "/servers")) | SCHEMA_PATHS
OPEN_PATHS = frozenset(("/health",))
SESSION_DETAIL = (
    "missing or wrong session token; send 'Authorization: Bearer <session_token>' with the "
    "session_token that POST /sessions/create returned"
)


def new_session_token() -> str:
    """256 random bits: the one credential of a session's routes."""
    return secrets.token_urlsafe(32)


class ProxyAccess:
    """The proxy's :data:`~atroposlib.security.gate.Authorize` over its open sessions."""

    def __init__(self, table: SessionTable, run_keys: Keys, admin_key: Keys) -> None:
        self.table = table
        self.run_keys = run_keys
        self.admin_key = admin_key

    def __call__(self, method: str, path: str, authorization: str) -> Refusal | None:
        if path in OPEN_PATHS:
            return None
        if path == "/sessions":
            return self._needs(self.admin_key, authorization, ADMIN_DETAIL)
        if not self.run_keys:
            return None
        if path in SERVICE_PATHS:
            return self._needs(self.run_keys, authorization)
        return self._session_route(path, authorization)

    def _needs(
        self, keys: Keys, authorization: str, detail: str = UNAUTHORIZED_DETAIL
    ) -> Refusal | None:
        if not keys or bearer_matches(authorization, keys):
            return None
        return unauthorized(detail)

    def _session_route(self, path: str, authorization: str) -> Refusal | None:
        session_id = path.split("/", 2)[1]
        session = self.table.get(session_id)
        if session is not None and bearer_header_ok(authorization, session.token):
            return None
        if self._needs(self.run_keys, authorization) is None:  # a key holder, not the owner
            return Refusal(404, f"session: no open session {session_id[:80]!r}")
        return unauthorized(SESSION_DETAIL)
