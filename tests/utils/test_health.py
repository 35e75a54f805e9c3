"""atroposlib/utils/health.py: the one wait for a server, against a real HTTP server on a free
loopback port and real child processes (one that exits early, one that never serves)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from atroposlib.errors import AtroposError
from atroposlib.utils.health import NotHealthyError, wait_healthy, wait_healthy_async
from tests.fakes import free_port

KEY = "health-key"


class _Starting(BaseHTTPRequestHandler):
    """``/health``: 503 for the first three asks, then 200 to a caller with the key (401
    without it)."""

    asks = 0

    def do_GET(self) -> None:
        type(self).asks += 1
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            status = 401
        else:
            status = 503 if type(self).asks <= 3 else 200
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def starting_server() -> Iterator[str]:
    handler = type("Handler", (_Starting,), {"asks": 0})
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/health"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


BEARER = {"Authorization": f"Bearer {KEY}"}


def test_it_returns_at_the_first_2xx_after_503s(starting_server: str) -> None:
    wait_healthy(starting_server, timeout_s=30, poll_s=0.01, headers=BEARER)


def test_the_async_wait_returns_at_the_first_2xx_after_503s(starting_server: str) -> None:
    asyncio.run(wait_healthy_async(starting_server, timeout_s=30, poll_s=0.01, headers=BEARER))


def test_an_answer_that_is_not_2xx_is_not_healthy(starting_server: str) -> None:
    with pytest.raises(NotHealthyError, match=r"^the server did not answer .*/health with 2xx"):
        wait_healthy(starting_server, timeout_s=0.5, poll_s=0.01)  # no key: always 401


def test_a_server_that_exits_first_is_named_with_its_code_and_log(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "server.log"
    log.write_text("loading\nmodel folder not found: /nope\n")
    started.append(subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]))
    url = f"http://127.0.0.1:{free_port()}/health"
    with pytest.raises(NotHealthyError) as err:
        wait_healthy(url, timeout_s=30, process=started[0], log_path=log, name="the server")
    assert err.value.exit_code == 3 and err.value.url == url
    assert str(err.value).startswith(
        f"the server exited with code 3 before it answered {url}; last lines of {log}:\n"
    )
    assert str(err.value).endswith("model folder not found: /nope")


def test_the_async_wait_also_stops_when_the_process_exits(
    started: list[subprocess.Popen[bytes]],
) -> None:
    started.append(subprocess.Popen([sys.executable, "-c", "raise SystemExit(4)"]))
    url = f"http://127.0.0.1:{free_port()}/health"
    with pytest.raises(NotHealthyError, match="exited with code 4") as err:
        asyncio.run(wait_healthy_async(url, timeout_s=30, process=started[0]))
    assert err.value.exit_code == 4


def test_a_server_that_never_answers_fails_at_the_deadline(
    started: list[subprocess.Popen[bytes]],
) -> None:
    started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
    url = f"http://127.0.0.1:{free_port()}/health"
    begun = time.monotonic()
    with pytest.raises(NotHealthyError, match=r"did not answer .* with 2xx within 1 s$") as err:
        wait_healthy(url, timeout_s=1.0, poll_s=0.05, process=started[0], name="the sleeper")
    assert 1.0 <= time.monotonic() - begun < 10
    assert err.value.exit_code is None and isinstance(err.value, AtroposError)
    assert started[0].poll() is None  # it gave up on a live process, not a dead one
