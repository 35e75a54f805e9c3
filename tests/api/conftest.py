"""Fixtures of the broker tests: in-process apps on each store, real broker processes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest
from broker_testlib import BrokerProcess, in_process

from atroposlib.api.settings import BrokerSettings


@pytest.fixture(params=["memory", "sqlite"])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory" if request.param == "memory" else f"sqlite:{tmp_path / 'broker.sqlite3'}"


@pytest.fixture
async def client(store_spec: str) -> AsyncIterator[httpx.AsyncClient]:
    async with in_process(BrokerSettings(store=store_spec)) as http:
        yield http


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    started: list[BrokerProcess] = []

    def start(
        *args: str, store: str | None = None, api_key: str | None = None,
        admin_key: str | None = None,
    ) -> BrokerProcess:  # fmt: skip
        spec = store or f"sqlite:{tmp_path / 'broker.sqlite3'}"
        process = BrokerProcess(spec, *args, api_key=api_key, admin_key=admin_key).start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
