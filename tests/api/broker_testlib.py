"""Helpers shared by the broker tests: bodies, an in-process app, a real broker process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from atroposlib.api.app import create_app
from atroposlib.api.settings import BrokerSettings
from atroposlib.api.store import GroupStore
from atroposlib.utils.health import wait_healthy
from tests.fakes import PROCESS_START_TIMEOUT_S, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


def trainer_body(**overrides: Any) -> dict[str, Any]:
    body = {
        "wandb_group": "group",
        "wandb_project": "project",
        "batch_size": 4,
        "max_token_len": 32,
        "checkpoint_dir": "ckpt",
        "save_checkpoint_interval": 10,
        "starting_step": 0,
        "num_steps": 100,
    }
    return {**body, **overrides}


def env_body(**overrides: Any) -> dict[str, Any]:
    body = {"max_token_length": 32, "desired_name": "gsm8k", "weight": 1.0, "group_size": 2}
    return {**body, **overrides}


def make_group(
    size: int = 2, length: int = 4, *, marker: int = 1000, env_id: int | None = None, **extra: Any
) -> dict[str, Any]:
    """A valid group; sequence i starts with token ``marker + i`` so deliveries can be counted."""
    tokens = [[marker + i] + [7] * (length - 1) for i in range(size)]
    masks = [[-100, *row[1:]] for row in tokens]
    group = {"tokens": tokens, "masks": masks, "scores": [float(i) for i in range(size)]}
    if env_id is not None:
        group["env_id"] = env_id
    return {**group, **extra}


def markers(groups: list[dict[str, Any]]) -> list[int]:
    return [int(row[0]) for group in groups for row in group["tokens"]]


@asynccontextmanager
async def in_process(
    settings: BrokerSettings | None = None, store: GroupStore | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on an app whose lifespan runs for the duration of the block."""
    app = create_app(settings or BrokerSettings(store="memory"), store=store)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            yield client


class BrokerProcess:
    """``python -m atroposlib.api`` on a free port, as users run it."""

    def __init__(
        self, store: str, *args: str, api_key: str | None = None, admin_key: str | None = None
    ) -> None:
        self.store = store
        self.args = args
        self.api_key = api_key
        self.admin_key = admin_key
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> BrokerProcess:
        command = [sys.executable, "-m", "atroposlib.api", "--port", str(self.port)]
        command += ["--store", self.store, "--log-level", "warning", *self.args]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        for variable in ("ATROPOS_API_KEY", "ATROPOS_ADMIN_API_KEY"):
            env.pop(variable, None)
        if self.api_key:
            env["ATROPOS_API_KEY"] = self.api_key
        if self.admin_key:
            env["ATROPOS_ADMIN_API_KEY"] = self.admin_key
        self.proc = subprocess.Popen(command, env=env)
        key = self.api_key or self.admin_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        wait_healthy(f"{self.url}/health", timeout_s=PROCESS_START_TIMEOUT_S, poll_s=0.1,
                     process=self.proc, headers=headers, name="the broker")  # fmt: skip
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
