"""Requests whose body never arrives in full, sent on a raw socket: a server that answers one
has decided without reading its body (httpx would wait to send the whole body first)."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

HANG_GUARD_S = 120.0
"""A server that waits for the body never answers; the test then fails on this timeout."""


@dataclass
class RawAnswer:
    status: int
    headers: dict[str, str]
    body: Any


def unfinished_post(
    url: str, path: str, headers: dict[str, str], *, declared: int | None, sent: bytes = b"{"
) -> RawAnswer:
    """POST ``path`` announcing ``declared`` body bytes (None: a chunked body that never
    ends), send only ``sent``, and read the answer while the rest is still owed."""
    address = urlsplit(url)
    lines = [f"POST {path} HTTP/1.1", f"Host: {address.netloc}", "Content-Type: application/json"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if declared is None:
        lines.append("Transfer-Encoding: chunked")
        body = f"{len(sent):x}\r\n".encode() + sent + b"\r\n"  # and never the last chunk
    else:
        lines.append(f"Content-Length: {declared}")
        body = sent
    with socket.create_connection((address.hostname, address.port), timeout=HANG_GUARD_S) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        return _read_answer(sock)


def _read_answer(sock: socket.socket) -> RawAnswer:
    received = b""
    while b"\r\n\r\n" not in received:
        received += _chunk(sock)
    head, _, rest = received.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        rest += _chunk(sock)
    return RawAnswer(int(status_line.split()[1]), headers, json.loads(rest[:length] or b"null"))


def _chunk(sock: socket.socket) -> bytes:
    data = sock.recv(65536)
    if not data:
        raise ConnectionError("the server closed the connection without a whole answer")
    return data
