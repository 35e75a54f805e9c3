"""An OpenEnv server this process starts from a local command.

The port must be free before the start, and once the server answers, the command (or a
descendant) must hold it; a container runtime's command (``docker run -p {port}:8000``) is
exempt from the second check, since the runtime, not the command, publishes the port.
"""

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
from pathlib import Path

from atroposlib.errors import ConfigError
from atroposlib.utils.health import NotHealthyError, wait_healthy_async
from atroposlib.utils.ports import PortTakenError, ensure_port_free

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
CONTAINER_RUNTIMES = frozenset({"docker", "podman", "nerdctl"})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child: be killed when the env process dies, even by SIGKILL (Linux)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


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
        try:
            ensure_port_free("127.0.0.1", self.port, "the OpenEnv server command")
        except PortTakenError as exc:
            raise ConfigError(str(exc)) from exc
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
        in_container = Path(self.argv[0]).name in CONTAINER_RUNTIMES
        try:
            await wait_healthy_async(f"{self.url}/health", timeout_s=timeout_s,
                                     process=self.process, log_path=self.log_path,
                                     name="the OpenEnv server command",
                                     own_port=not in_container)  # fmt: skip
        except NotHealthyError as exc:
            self.stop()
            raise ConfigError(str(exc)) from exc

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
