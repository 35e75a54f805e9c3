"""Fixtures of the tools' tests: the real test-model tokenizer, the fixture dump, CLI runners."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from atroposlib.utils.health import wait_healthy
from tests.fakes import PROCESS_START_TIMEOUT_S, free_port
from tests.tools.fixture_groups import DATA, GROUPS_PATH


@dataclass
class ToolRun:
    code: int
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


@pytest.fixture(scope="session")
def tokenizer_dir(test_model_path: Path) -> str:
    return str(test_model_path)


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture
def groups_path() -> Path:
    return GROUPS_PATH


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def expected_lines(kind: str) -> list[dict[str, Any]]:
    return read_lines(DATA / f"expected_{kind}.jsonl")


@pytest.fixture
def run_tool(capsys: pytest.CaptureFixture[str]) -> Callable[..., ToolRun]:
    """Run ``atropos-sft-gen``/``atropos-dpo-gen`` in-process; returns exit code and stderr."""
    from atroposlib.cli import dpo, sft

    def run(kind: str, *argv: str | Path) -> ToolRun:
        main = sft.main if kind == "sft" else dpo.main
        capsys.readouterr()
        try:
            main([str(arg) for arg in argv])
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        return ToolRun(code, capsys.readouterr().err)

    return run


@dataclass
class LiveBroker:
    url: str
    process: subprocess.Popen[bytes]

    def get(self, path: str, **params: Any) -> Any:
        response = httpx.get(self.url + path, params=params, timeout=10)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: Any) -> Any:
        response = httpx.post(self.url + path, json=body, timeout=10)
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture
def live_broker(tmp_path: Path, subprocess_env: dict[str, str]) -> Iterator[LiveBroker]:
    """A real broker process (``python -m atroposlib.api``) on a free port, durable store."""
    port = free_port()
    command = [sys.executable, "-m", "atroposlib.api", "--port", str(port)]
    command += ["--store", f"sqlite:{tmp_path / 'broker.sqlite3'}", "--log-level", "warning"]
    process = subprocess.Popen(command, env=subprocess_env)
    broker = LiveBroker(f"http://127.0.0.1:{port}", process)
    wait_healthy(f"{broker.url}/health", timeout_s=PROCESS_START_TIMEOUT_S, poll_s=0.1,
                 process=process, name="the broker")  # fmt: skip
    yield broker
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def without_env_ids(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**group, "env_id": None} for group in groups]


def fixture_groups() -> list[dict[str, Any]]:
    return read_lines(GROUPS_PATH)
