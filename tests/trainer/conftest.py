"""Fixtures for the trainer tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from trainer_helpers import FAKE_SERVER, tiny_llama

from atroposlib.utils.health import wait_healthy
from tests.fakes import free_port


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 2-layer Llama (hidden 64, vocab 256) saved as an HF folder."""
    return tiny_llama(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def fake_server(tiny_model: Path, subprocess_env: dict[str, str]) -> Iterator[Callable[..., str]]:
    """Start fake_inference_server.py processes on free ports; yields a starter -> base URL."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*extra: str) -> str:
        port = free_port()
        cmd = [sys.executable, str(FAKE_SERVER), "--model", str(tiny_model), "--port", str(port)]
        proc = subprocess.Popen([*cmd, *extra], env=subprocess_env)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(f"{url}/health", timeout_s=120, process=proc)
        return url

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def service(subprocess_env: dict[str, str]) -> Iterator[Callable[..., str]]:
    """Start ``python -m <module> ... --port N`` on a free port; yields a starter -> base URL."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(module: str, *args: str, timeout: float = 180.0) -> str:
        port = free_port()
        cmd = [sys.executable, "-m", module, *args, "--port", str(port)]
        proc = subprocess.Popen(cmd, env=subprocess_env)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(f"{url}/health", timeout_s=timeout, process=proc)
        return url

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=30)
