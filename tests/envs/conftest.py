"""Fixtures of the env framework tests: a real broker and a fake inference server per test;
``smol``, the embedded server with the real small model, once per module."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from envs_testlib import Process, broker_process, child_env, fake_inference

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "inference"))
from inference_helpers import RunningServer, start_server, stop_server


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Process]:
    process = fake_inference(tmp_path).start()
    yield process
    process.stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Process]:
    process = broker_process(tmp_path).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def smol(
    test_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    log = tmp_path_factory.mktemp("smol") / "server.log"
    server = start_server(test_model_path, child_env(), log, "--threads", "1")
    yield server
    stop_server(server)
