"""Fixtures of the env framework tests: a real broker and a fake inference server per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from envs_testlib import Process, broker_process, fake_inference


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
