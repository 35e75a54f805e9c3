"""``serve`` against a broker that dies, or pushes back: nothing lost, nothing doubled."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from envs_testlib import (
    Process,
    broker_process,
    child_env,
    env_command,
    pull_batches,
    register_trainer,
)


def start_env(
    broker: Process, fake: Process, tmp_path: Path, *flags: str
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        env_command(
            "serve",
            f"--env.rollout_server_url={broker.url}",
            f"--openai.base_url={fake.url}/v1",
            f"--env.data_path_to_save_groups={tmp_path / 'sent.jsonl'}",
            "--env.steps_per_eval=0",
            *flags,
        ),
        env=child_env(),
        stdout=(tmp_path / "env.log").open("ab"),
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )


def drain(broker_url: str) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    while batch := httpx.get(broker_url + "/batch", timeout=10).json()["batch"]:
        groups.extend(batch)
    return groups


def generated_ids(tmp_path: Path) -> list[str]:
    lines = (tmp_path / "sent.jsonl").read_text().splitlines()
    return [json.loads(line)["group_id"] for line in lines]


@pytest.mark.slow
def test_broker_killed_and_restarted_every_group_arrives_exactly_once(
    fake: Process, tmp_path: Path
) -> None:
    store = f"sqlite:{tmp_path / 'broker.sqlite3'}"
    broker = broker_process(tmp_path, store=store).start()
    register_trainer(broker.url, batch_size=4)
    env = start_env(broker, fake, tmp_path, "--env.total_steps=8")
    delivered: list[dict[str, Any]] = []
    try:
        delivered += [g for b in pull_batches(broker.url, 3, timeout=120) for g in b]
        broker.stop()
        time.sleep(4)  # the env keeps generating what it had started, then spools
        broker = broker_process(tmp_path, store=store, port=broker.port).start()
        while env.poll() is None:
            delivered += drain(broker.url)
            time.sleep(0.2)
        assert env.returncode == 0, (tmp_path / "env.log").read_text()[-3000:]
        delivered += drain(broker.url)
    finally:
        env.kill()
        broker.stop()
    ids = [group["group_id"] for group in delivered]
    assert len(ids) == len(set(ids)), "a group arrived twice"
    assert sorted(ids) == sorted(generated_ids(tmp_path)), "a generated group was lost"
    log = (tmp_path / "env.log").read_text()
    assert "spooling" in log or "unreachable" in log


@pytest.mark.slow
def test_backpressure_pauses_generation_until_the_trainer_catches_up(
    broker: Process, fake: Process, tmp_path: Path
) -> None:
    register_trainer(broker.url, batch_size=4)
    env = start_env(broker, fake, tmp_path, "--env.total_steps=50", "--env.max_batches_offpolicy=2")
    try:
        deadline = time.monotonic() + 90
        while httpx.get(broker.url + "/status").json()["queue_size"] < 2:
            assert time.monotonic() < deadline and env.poll() is None
            time.sleep(0.2)
        time.sleep(2)
        paused_at = httpx.get(fake.url + "/control").json()["served"]
        time.sleep(2)
        assert httpx.get(fake.url + "/control").json()["served"] == paused_at, "still generating"
        assert httpx.get(broker.url + "/status").json()["queue_size"] == 2
        pull_batches(broker.url, 2)
        deadline = time.monotonic() + 30
        while httpx.get(fake.url + "/control").json()["served"] <= paused_at:
            assert time.monotonic() < deadline, "generation did not resume"
            time.sleep(0.2)
    finally:
        env.kill()


@pytest.mark.slow
def test_a_full_broker_503_retry_after_is_followed_and_nothing_is_lost(
    fake: Process, tmp_path: Path
) -> None:
    broker = broker_process(
        tmp_path, "memory", None, "--max-queued-groups", "2", "--retry-after-seconds", "1"
    ).start()
    register_trainer(broker.url, batch_size=4)
    env = start_env(broker, fake, tmp_path, "--env.total_steps=6", "--env.max_batches_offpolicy=0")
    delivered: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 90
        while "answered 503" not in (tmp_path / "env.log").read_text():
            assert time.monotonic() < deadline and env.poll() is None
            time.sleep(0.2)
        while httpx.get(broker.url + "/status").json()["queue_size"] < 2:
            assert time.monotonic() < deadline and env.poll() is None
            time.sleep(0.2)
        while env.poll() is None:
            assert httpx.get(broker.url + "/status").json()["queue_size"] <= 2
            delivered += drain(broker.url)
            time.sleep(1.0)
        assert env.returncode == 0, (tmp_path / "env.log").read_text()[-3000:]
        delivered += drain(broker.url)
    finally:
        env.kill()
        broker.stop()
    ids = [group["group_id"] for group in delivered]
    assert len(ids) == len(set(ids)) >= 6
    assert sorted(ids) == sorted(generated_ids(tmp_path))
