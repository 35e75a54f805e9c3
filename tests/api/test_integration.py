"""A real broker process: Atropos-style JSON clients, kill -9 recovery, body limits, the CLI."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from broker_testlib import REPO_ROOT, BrokerProcess, env_body, make_group, markers, trainer_body

MiB = 1024 * 1024


def test_atropos_style_json_client_flow(broker_process: Callable[..., BrokerProcess]) -> None:
    broker = broker_process()
    with httpx.Client(base_url=broker.url) as http:
        assert http.post("/register", json=trainer_body(batch_size=4)).json()["uuid"] > 0
        assert (
            http.post("/register-env", json=env_body()).json()["status"]
            == "wait for trainer to start"
        )
        assert http.get("/batch").json()["batch"] is None
        env_id = http.post("/register-env", json=env_body()).json()["env_id"]
        status = http.request("GET", "/status-env", json={"env_id": env_id}).json()
        assert status["queue_size"] == 0 and status["env_weight"] == 1.0
        body = gzip.compress(
            httpx.Request("POST", "/", json=make_group(2, marker=1, env_id=env_id)).read()
        )
        posted = http.post("/scored_data", content=body, headers={"Content-Encoding": "gzip"})
        assert posted.json()["status"] == "received"
        http.post("/scored_data_list", json=[make_group(2, marker=3, env_id=env_id)])
        batch = http.get("/batch").json()
        assert markers(batch["batch"]) == [1, 2, 3, 4]
        assert http.get("/status").json() == {"current_step": 1, "queue_size": 0}
        assert http.post("/disconnect-env", json={"env_id": env_id}).json() == {"status": "success"}


def _poster(url: str, count: int, acknowledged: list[int]) -> None:
    """Post groups of 2 (markers 2i, 2i+1), retrying each one until it is answered 2xx."""
    with httpx.Client(base_url=url, timeout=5) as http:
        for i in range(count):
            group = make_group(2, marker=10_000 + 2 * i, group_id=f"g{i}")
            while True:
                try:
                    if http.post("/scored_data", json=group).status_code == 200:
                        acknowledged.append(i)
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.02)


def _pull(http: httpx.Client, until: Callable[[], bool]) -> Iterator[tuple[int, list[int]]]:
    deadline = time.monotonic() + 90
    while not until():
        assert time.monotonic() < deadline, "batches stopped coming: something was lost"
        try:
            answer = http.get("/batch").json()
        except httpx.TransportError:
            time.sleep(0.05)
            continue
        if answer["batch"] is None:
            time.sleep(0.01)
            continue
        yield answer["step"], markers(answer["batch"])


@pytest.mark.slow
def test_kill_9_loses_and_duplicates_nothing(broker_process: Callable[..., BrokerProcess]) -> None:
    broker = broker_process()
    registration = trainer_body(batch_size=4, acknowledges=True)
    groups = 300
    acknowledged: list[int] = []
    poster = threading.Thread(target=_poster, args=(broker.url, groups, acknowledged), daemon=True)
    trained: list[int] = []
    with httpx.Client(base_url=broker.url, timeout=5) as http:
        http.post("/register", json=registration)
        poster.start()
        pending: list[int] = []
        checkpoint = 0
        for step, seen in _pull(http, until=lambda: len(acknowledged) > groups // 3):
            pending += seen
            if step % 2 == 0:  # the trainer saves a checkpoint, then acknowledges
                trained.extend(pending)
                pending = []
                checkpoint = step
                http.post("/ack", json={"step": step})
        broker.kill9()
        in_flight = len(acknowledged)
        broker.start()
        http.post("/register", json={**registration, "starting_step": checkpoint})
        for _, seen in _pull(http, until=lambda: len(trained) >= 2 * groups):
            trained.extend(seen)
        poster.join(timeout=30)
        assert not poster.is_alive()
        assert http.get("/status").json()["queue_size"] == 0
    assert 0 < in_flight < groups
    assert len(acknowledged) == groups
    assert len(trained) == len(set(trained)) == 2 * groups
    assert set(trained) == set(range(10_000, 10_000 + 2 * groups))


def _rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def _gzip_bomb(inflated: int) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MiB)
    parts = [compressor.compress(zeros) for _ in range(inflated // MiB)]
    return b"".join(parts) + compressor.flush()


@pytest.mark.slow
def test_gzip_bomb_and_oversized_body_are_413_with_flat_memory(
    broker_process: Callable[..., BrokerProcess],
) -> None:
    broker = broker_process(
        "--max-request-bytes", str(4 * MiB), "--max-inflated-bytes", str(16 * MiB)
    )
    bomb = _gzip_bomb(1024 * MiB)
    assert len(bomb) < 4 * MiB
    with httpx.Client(base_url=broker.url, timeout=30) as http:
        http.post("/scored_data", json=make_group())
        before = _rss(broker.pid)
        for _ in range(3):
            answer = http.post("/scored_data", content=bomb, headers={"Content-Encoding": "gzip"})
            assert answer.status_code == 413 and "max_inflated_bytes" in answer.json()["detail"]
        oversized = b"[" + b"1," * (25 * MiB) + b"1]"
        answer = http.post("/scored_data", content=oversized)
        assert answer.status_code == 413 and "max_request_bytes" in answer.json()["detail"]
        streamed = http.post(
            "/scored_data",
            content=iter([oversized[i : i + MiB] for i in range(0, len(oversized), MiB)]),
        )
        assert streamed.status_code == 413
        grown = _rss(broker.pid) - before
        assert grown < 48 * MiB, f"broker RSS grew by {grown / MiB:.0f} MiB"
        assert http.get("/status").json()["queue_size"] == 1


def test_cli_rejects_bad_flags_with_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    for args in (["--port", "notaport"], ["--store", "postgres://x"], ["--bogus-flag", "1"]):
        done = subprocess.run(
            [sys.executable, "-m", "atroposlib.api", *args],
            env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 2, (args, done.stderr)
        assert "error" in done.stderr.lower()
