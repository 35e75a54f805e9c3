"""An OpenEnv server this process starts from a local command, and its health wait."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from atroposlib.errors import ConfigError

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child: be killed when the env process dies, even by SIGKILL (Linux)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


async def wait_healthy(url: str, timeout_s: float, process: subprocess.Popen[bytes] | None) -> None:
    """Poll ``GET {url}/health`` until it answers 200; ConfigError on timeout or early exit."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2.0) as http:
        while True:
            if process is not None and process.poll() is not None:
                raise ConfigError(f"the OpenEnv server command exited with {process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(f"{url.rstrip('/')}/health")).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise ConfigError(f"the OpenEnv server at {url} is not healthy after {timeout_s}s")
            await asyncio.sleep(0.2)


class LocalServer:
    """``command`` (``{port}`` replaced by a free port) run until ``stop()`` or our exit."""

    def __init__(self, command: str, log_path: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.argv = [part.replace("{port}", str(self.port)) for part in shlex.split(command)]
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, timeout_s: float) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
                env={**os.environ, "PORT": str(self.port)},
            )
        logger.info("started OpenEnv server %s (pid %d), log %s", self.argv, self.process.pid,
                    self.log_path)  # fmt: skip
        try:
            await wait_healthy(self.url, timeout_s, self.process)
        except ConfigError as exc:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-1500:]
            raise ConfigError(f"{exc}; its log ends:\n{tail}") from exc

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


async def hold(server: LocalServer) -> None:
    """Keep ``server`` until this task is cancelled (``asyncio.run`` does at the end)."""
    try:
        await asyncio.Event().wait()
    finally:
        server.stop()
