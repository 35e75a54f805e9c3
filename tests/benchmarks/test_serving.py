"""benchmarks/serving.py: the benchmarks' wait for a server they started, against real
processes (Python's own http.server for the healthy case)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.serving import wait_until_healthy
from tests.fakes import free_port


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        process.kill()
        process.wait(timeout=10)


def test_it_returns_once_health_answers_200(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    (tmp_path / "health").write_text("ok")
    port = free_port()
    started.append(subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
         "--directory", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    ))  # fmt: skip
    wait_until_healthy(f"http://127.0.0.1:{port}", started[0], 30)
    assert started[0].poll() is None


def test_a_server_that_exits_first_is_named_with_its_code_and_log(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    started.append(subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]))
    log = tmp_path / "server.log"
    with pytest.raises(
        RuntimeError, match=r"^the server exited with 3 before it served; see .*server\.log"
    ):
        wait_until_healthy(
            f"http://127.0.0.1:{free_port()}", started[0], 30, log, name="the server"
        )


def test_a_server_that_never_answers_fails_at_the_deadline_instead_of_going_on(
    started: list[subprocess.Popen[bytes]],
) -> None:
    started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
    with pytest.raises(RuntimeError, match=r"did not answer /health within 1 s"):
        wait_until_healthy(f"http://127.0.0.1:{free_port()}", started[0], 1.0)
    assert started[0].poll() is None  # it gave up on a live process, not a dead one
