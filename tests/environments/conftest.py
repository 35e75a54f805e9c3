"""Fixtures of the environment catalogue tests: a scripted inference server per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from envcat_testlib import ScriptedServer


@pytest.fixture
def scripted(tmp_path: Path) -> Iterator[Callable[[list[dict[str, Any]]], ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def start(rules: list[dict[str, Any]]) -> ScriptedServer:
        servers.append(ScriptedServer(rules, tmp_path))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()
