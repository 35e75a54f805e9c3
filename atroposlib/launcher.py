"""Start, watch and stop the processes of a local run (broker, inference, env, trainer).

Each component runs in its own process group with its output in ``<run_dir>/logs/<name>.log``.
``start`` refuses a component whose health port something already listens on, and returns once
the component itself answers its health URL (:mod:`atroposlib.utils.ports`); ``stop_all`` ends
components in reverse order (SIGTERM to the group, then SIGKILL), so nothing is left behind.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

from atroposlib.errors import AtroposError
from atroposlib.utils.health import NotHealthyError, log_tail, wait_healthy
from atroposlib.utils.ports import PortTakenError, ensure_port_free, host_port

logger = logging.getLogger(__name__)


class ComponentFailedError(AtroposError):
    """A component exited or never became healthy; the message carries its log tail."""


@dataclass(frozen=True)
class Component:
    name: str
    argv: Sequence[str]
    health_url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 300.0


@dataclass
class _Running:
    component: Component
    process: subprocess.Popen[bytes]
    log_path: Path


class Supervisor:
    """Owns the child processes of one run; use as a context manager."""

    def __init__(
        self,
        run_dir: Path,
        *,
        http: httpx.Client | None = None,
        env: Mapping[str, str] | None = None,
        withheld: Collection[str] = (),
    ) -> None:
        """``env``: variables every component gets (the run's key), below its own ``env``;
        ``withheld``: variables of this process that no component inherits (an admin key the
        launching shell holds: only a component's own ``env`` may carry one)."""
        self.env = dict(env or {})
        self.withheld = frozenset(withheld)
        self.log_dir = run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._http = http or httpx.Client(timeout=2.0)
        self._running: list[_Running] = []

    def start(self, component: Component) -> None:
        if component.health_url:
            try:
                ensure_port_free(*host_port(component.health_url), component.name)
            except PortTakenError as err:
                raise ComponentFailedError(str(err)) from err
        log_path = self.log_dir / f"{component.name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed in stop_all
        process = subprocess.Popen(
            list(component.argv),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**self.inherited(), **self.env, **component.env},
            start_new_session=True,
        )
        log_file.close()
        running = _Running(component, process, log_path)
        self._running.append(running)
        logger.info("started %s (pid %d), log %s", component.name, process.pid, log_path)
        if component.health_url:
            self._wait_healthy(running)

    def inherited(self) -> dict[str, str]:
        """This process's variables that every component inherits."""
        return {k: v for k, v in os.environ.items() if k not in self.withheld}

    def exited(self) -> list[tuple[str, int]]:
        """Components that have exited, with their return codes."""
        return [
            (r.component.name, code)
            for r in self._running
            if (code := r.process.poll()) is not None
        ]

    def returncode(self, name: str) -> int | None:
        return self._find(name).process.poll()

    def wait(self, name: str, timeout_s: float | None = None) -> int:
        return self._find(name).process.wait(timeout=timeout_s)

    def pids(self) -> dict[str, int]:
        return {r.component.name: r.process.pid for r in self._running}

    def log_tail(self, name: str, lines: int = 30) -> str:
        return log_tail(self._find(name).log_path, lines)

    def stop_all(self, grace_s: float = 15.0) -> None:
        for running in reversed(self._running):
            _stop(running.process, grace_s)
        self._running.clear()

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()
        self._http.close()

    def _find(self, name: str) -> _Running:
        for running in self._running:
            if running.component.name == name:
                return running
        raise KeyError(name)

    def _wait_healthy(self, running: _Running) -> None:
        component = running.component
        assert component.health_url is not None
        try:
            wait_healthy(
                component.health_url,
                timeout_s=component.startup_timeout_s,
                poll_s=0.25,
                process=running.process,
                log_path=running.log_path,
                name=component.name,
                client=self._http,
            )
        except NotHealthyError as err:
            raise ComponentFailedError(str(err)) from err
        logger.info("%s is healthy", component.name)


def _stop(process: subprocess.Popen[bytes], grace_s: float) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        logger.warning("pid %d ignored SIGTERM for %.0f s; killing it", process.pid, grace_s)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        process.wait()
