"""Response heads and bodies leave in one write; heads without a body are never held back."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from broker_testlib import BrokerProcess

from atroposlib.api.serving import CoalescingTransport


class RecordingTransport:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, parts: Any) -> None:
        self.calls.append(("writelines", [bytes(p) for p in parts]))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.calls.append(("close", None))

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


async def test_head_and_body_go_out_in_one_call() -> None:
    real = RecordingTransport()
    wrapped = CoalescingTransport(real, asyncio.get_running_loop())  # type: ignore[arg-type]
    wrapped.write(HEAD)
    assert real.calls == []
    wrapped.write(b"ok")
    assert real.calls == [("writelines", [HEAD, b"ok"])]
    wrapped.write(b"more")  # not a head: straight through
    assert real.calls[-1] == ("write", b"more")
    assert wrapped.get_extra_info("peername") == "info:peername"
    await asyncio.sleep(0)  # the scheduled flush finds nothing held
    assert len(real.calls) == 2


async def test_a_head_alone_is_sent_at_the_end_of_the_loop_iteration() -> None:
    real = RecordingTransport()
    wrapped = CoalescingTransport(real, asyncio.get_running_loop())  # type: ignore[arg-type]
    wrapped.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    await asyncio.sleep(0)
    assert real.calls == [("write", b"HTTP/1.1 204 No Content\r\n\r\n")]
    wrapped.write(HEAD)
    wrapped.close()
    assert real.calls[-2:] == [("write", HEAD), ("close", None)]


@pytest.fixture(scope="module")
def broker() -> Any:
    process = BrokerProcess("memory").start()
    yield process
    process.stop()


def _exchange(port: int, request: bytes, answers: int, head_only: bool = False) -> bytes:
    """Send raw HTTP/1.1 on one keep-alive connection; read until ``answers`` answers ended."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        received = b""
        while not ((head_only and received.endswith(b"\r\n\r\n")) or _complete(received, answers)):
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {received!r}"
            received += chunk
        return received


def _complete(data: bytes, answers: int) -> bool:
    parts = data.split(b"HTTP/1.1 ")[1:]
    if len(parts) < answers:
        return False
    last = parts[-1]
    head, sep, body = last.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return True


def test_real_server_answers_head_get_and_pipelined_requests(broker: BrokerProcess) -> None:
    head = _exchange(broker.port, b"HEAD /status HTTP/1.1\r\nHost: x\r\n\r\n", 1, head_only=True)
    assert head.startswith(b"HTTP/1.1 ")  # answered, not held back waiting for a body
    pipelined = (
        b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /batch HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    answers = _exchange(broker.port, pipelined, 3)
    assert answers.count(b"HTTP/1.1 200 OK") == 2 and b"HTTP/1.1 409 Conflict" in answers
    assert b'"queue_size":0' in answers and b"AtroposLib API" in answers
