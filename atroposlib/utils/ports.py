"""The port of a server we start: free before it starts, held by our process once it answers.

``ensure_port_free(host, port, what)`` raises :class:`PortTakenError`, one line naming
``host:port`` and what was not started, when something already listens there.
``foreign_listener(host, port, pid)`` names the holder of a socket that listens on ``port`` for
``host`` outside ``pid``'s process tree, or returns None when every such socket is held inside
it: a wait asks it once the health URL answers, so that another server on the port is never
taken for the one it started. Where this system will not list sockets (macOS without root) it
cannot tell and returns None.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

import psutil

from atroposlib.errors import AtroposError

__all__ = ["PortTakenError", "ensure_port_free", "foreign_listener", "host_port"]

_WILDCARDS = frozenset({"0.0.0.0", "::"})


class PortTakenError(AtroposError):
    """Something already listens on the port a server we were about to start would use."""

    def __init__(self, host: str, port: int, what: str, holder: str | None = None) -> None:
        by = f" by {holder}" if holder else ""
        super().__init__(f"port {host}:{port} is already in use{by}; not starting {what}")
        self.host = host
        self.port = port


def host_port(url: str) -> tuple[str, int]:
    """The host and port ``url`` reaches: ``http://127.0.0.1:8000/health`` -> (127.0.0.1, 8000)."""
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)


def ensure_port_free(host: str, port: int, what: str) -> None:
    """Bind each address of ``host`` on ``port`` as a server would (``SO_REUSEADDR``: a closed
    connection's TIME_WAIT does not count) and raise :class:`PortTakenError` if a listener is in
    the way. An address this machine cannot bind is left for the server itself to report."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return
    for family, kind, proto, _, address in found:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise PortTakenError(host, port, what, _holders_of(host, port)) from exc


def foreign_listener(host: str, port: int, pid: int) -> str | None:
    """Who holds a socket listening on ``port`` for ``host`` outside ``pid`` and its
    descendants (e.g. "pid 4242 (python3)"), or None when each such socket is held inside."""
    try:
        holders = _listeners(host, port)
    except psutil.AccessDenied:
        return None
    if not holders:
        return "no process on this machine"
    tree = _process_tree(pid)
    for pids in holders.values():
        if not pids & tree:
            return _describe(pids)
    return None


def _listeners(host: str, port: int) -> dict[str, set[int | None]]:
    """The pids holding each socket that listens on ``port`` at an address ``host`` reaches (a
    wildcard one, or one ``host`` resolves to), by address; None: a pid we may not look into."""
    addresses = _addresses(host, port) | _WILDCARDS
    holders: dict[str, set[int | None]] = {}
    for conn in psutil.net_connections("tcp"):
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        ip = conn.laddr.ip.removeprefix("::ffff:")
        if ip in addresses:
            holders.setdefault(ip, set()).add(conn.pid)
    return holders


def _holders_of(host: str, port: int) -> str | None:
    try:
        return _describe(*_listeners(host, port).values())
    except psutil.AccessDenied:
        return None


def _addresses(host: str, port: int) -> set[str]:
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return {host}
    return {str(info[4][0]).removeprefix("::ffff:") for info in found} | {host}


def _process_tree(pid: int) -> set[int | None]:
    try:
        root = psutil.Process(pid)
        return {pid, *(child.pid for child in root.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def _describe(*holders: Iterable[int | None]) -> str | None:
    pids = {pid for group in holders for pid in group}
    if not pids:
        return None
    named = [_name(pid) for pid in sorted(pid for pid in pids if pid is not None)]
    if None in pids:
        named.append("a process of another user")
    return ", ".join(named)


def _name(pid: int) -> str:
    try:
        return f"pid {pid} ({psutil.Process(pid).name()})"
    except psutil.Error:
        return f"pid {pid}"
