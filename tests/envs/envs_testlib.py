"""Real processes for the env tests: the broker, the fake inference server, an env CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from atroposlib.utils.health import wait_healthy
from tests.fakes import PROCESS_START_TIMEOUT_S, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
EXAMPLE_ENV = HERE / "example_env.py"


def tokenizer_path() -> str:
    try:
        from atroposlib.utils.test_model import ensure_test_model

        return str(ensure_test_model())
    except ImportError:
        return str(Path.home() / ".cache/atroposlib/models/SmolLM2-135M-Instruct")


def child_env(**extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "EXAMPLE_TOKENIZER": tokenizer_path(),
    }
    env.update(extra)
    return env


class Process:
    """A child process with a port; ``stop()`` ends it (and only it)."""

    def __init__(
        self, args: list[str], port: int, health: str, log: Path, key: str | None = None, **env: str
    ) -> None:
        self.args, self.port, self.health, self.log, self.env = args, port, health, log, env
        self.headers = {"Authorization": f"Bearer {key}"} if key else None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Process:
        handle = self.log.open("ab")
        self.proc = subprocess.Popen(
            self.args, stdout=handle, stderr=subprocess.STDOUT, env=child_env(**self.env)
        )
        try:
            wait_healthy(self.url + self.health, timeout_s=PROCESS_START_TIMEOUT_S, poll_s=0.1,
                         process=self.proc, log_path=self.log,
                         headers=self.headers)  # fmt: skip
        except BaseException:
            self.stop()  # a server that never came up is not left running
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def broker_process(
    tmp: Path, store: str = "memory", port: int | None = None, *extra: str
) -> Process:
    port = port or free_port()
    args = [sys.executable, "-m", "atroposlib.api", "--port", str(port), "--store", store, *extra]
    key = extra[extra.index("--api-key") + 1] if "--api-key" in extra else None
    return Process(args, port, "/health", tmp / "broker.log", key)


def fake_inference(tmp: Path) -> Process:
    port = free_port()
    args = [sys.executable, str(HERE / "fake_openai.py"), "--port", str(port)]
    return Process(args, port, "/health", tmp / "fake.log")


def set_mode(fake: Process, mode: str) -> dict[str, Any]:
    return httpx.post(fake.url + "/control", json={"mode": mode}).json()  # type: ignore[no-any-return]


def register_trainer(broker_url: str, batch_size: int = 8, **extra: Any) -> None:
    """Register a trainer and poll /batch once, so envs may register."""
    body = {
        "wandb_group": "g",
        "wandb_project": "p",
        "batch_size": batch_size,
        "max_token_len": 512,
        "checkpoint_dir": extra.pop("checkpoint_dir", "ckpt"),
        "save_checkpoint_interval": extra.pop("save_checkpoint_interval", 0),
        "starting_step": 0,
        "num_steps": 100,
        **extra,
    }
    httpx.post(broker_url + "/register", json=body).raise_for_status()
    httpx.get(broker_url + "/batch").raise_for_status()


def pull_batches(broker_url: str, count: int, timeout: float = 60.0) -> list[list[dict[str, Any]]]:
    """Act as the trainer: take ``count`` batches (each advances the broker's step)."""
    batches: list[list[dict[str, Any]]] = []
    deadline = time.monotonic() + timeout
    while len(batches) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(batches)} of {count} batches in {timeout} s")
        batch = httpx.get(broker_url + "/batch", timeout=10).json()["batch"]
        if batch:
            batches.append(batch)
        else:
            time.sleep(0.1)
    return batches


def env_command(command: str, *flags: str, script: Path = EXAMPLE_ENV) -> list[str]:
    return [sys.executable, str(script), command, *flags]
