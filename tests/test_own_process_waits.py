"""A wait trusts only the process it started (issue 59): for each launcher, another server
already answering 200 on the port (a real process of its own) is refused in one line naming
the port, nothing is reported healthy, and the launcher's own server still passes.

Launchers: the shared helpers (atroposlib/utils/ports.py, health.py), the local Supervisor,
the trainer's VllmRestart (a plain HTTP server in place of vLLM), the OpenEnv LocalServer and
slurm/lib.sh (real bash, an ``srun`` that runs its command here). The env's managed-server
proxy binds port 0 inside its own process, so no other process can be on its port.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from atroposlib.envs.adapters.openenv_server import LocalServer
from atroposlib.errors import ConfigError
from atroposlib.launcher import Component, ComponentFailedError, Supervisor
from atroposlib.utils.health import NotHealthyError, wait_healthy, wait_healthy_async
from atroposlib.utils.ports import PortTakenError, ensure_port_free
from tests.fakes import HEALTH_SERVER, free_port, health_server

REPO = Path(__file__).resolve().parents[1]
SERVE = [sys.executable, "-c", HEALTH_SERVER]
SERVE_COMMAND = shlex.join(SERVE)  # then the port
NEVER_SERVES = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def decoy(port: int) -> Iterator[subprocess.Popen[bytes]]:
    """Another server, already answering 200 on ``port``."""
    with health_server(port) as process:
        yield process


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text, text
    return text


# ---- the shared helpers ----


def test_a_taken_port_is_refused_before_the_start_naming_it_and_its_holder(
    port: int, decoy: subprocess.Popen[bytes]
) -> None:
    with pytest.raises(PortTakenError) as err:
        ensure_port_free("127.0.0.1", port, "the broker")
    assert one_line(err.value).startswith(f"port 127.0.0.1:{port} is already in use by pid "
                                          f"{decoy.pid} (")  # fmt: skip
    assert one_line(err.value).endswith("; not starting the broker")
    with pytest.raises(PortTakenError, match=f"port localhost:{port} is already in use"):
        ensure_port_free("localhost", port, "the broker")


def test_a_free_port_passes_the_check(port: int) -> None:
    ensure_port_free("127.0.0.1", port, "the broker")


def test_the_wait_refuses_an_answer_from_another_process_on_the_port(
    port: int, decoy: subprocess.Popen[bytes], started: list[subprocess.Popen[bytes]]
) -> None:
    started.append(subprocess.Popen(NEVER_SERVES))
    url = f"http://127.0.0.1:{port}/health"
    with pytest.raises(NotHealthyError) as err:
        wait_healthy(url, timeout_s=30, poll_s=0.05, process=started[0], name="the broker")
    assert one_line(err.value) == (
        f"the broker: {url} answered, but port {port} is held by pid {decoy.pid} "
        f"({_comm(decoy.pid)}), not by the process we started (pid {started[0].pid}); stop that "
        "one or choose another port"
    )
    with pytest.raises(NotHealthyError, match=f"port {port} is held by pid {decoy.pid} "):
        asyncio.run(wait_healthy_async(url, timeout_s=30, poll_s=0.05, process=started[0]))


def test_the_wait_passes_for_the_process_it_started_or_a_descendant_serving(
    port: int, started: list[subprocess.Popen[bytes]]
) -> None:
    started.append(subprocess.Popen([*SERVE, str(port)]))
    wait_healthy(f"http://127.0.0.1:{port}/health", timeout_s=30, poll_s=0.05, process=started[0])
    other = free_port()
    wrapper = f"import subprocess; subprocess.run({[*SERVE, str(other)]!r})"
    started.append(subprocess.Popen([sys.executable, "-c", wrapper]))
    asyncio.run(wait_healthy_async(f"http://localhost:{other}/health", timeout_s=30,
                                   poll_s=0.05, process=started[1]))  # fmt: skip


def test_a_command_whose_port_a_container_runtime_publishes_is_exempt(
    port: int, decoy: subprocess.Popen[bytes], started: list[subprocess.Popen[bytes]]
) -> None:
    """``docker run -p``: the runtime, not the command, holds the port (own_port=False)."""
    started.append(subprocess.Popen(NEVER_SERVES))
    wait_healthy(f"http://127.0.0.1:{port}/health", timeout_s=30, process=started[0],
                 own_port=False)  # fmt: skip


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


# ---- the local launcher's Supervisor ----


def test_the_supervisor_starts_nothing_on_a_taken_port(
    tmp_path: Path, port: int, decoy: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="atroposlib.launcher")
    web = Component("web", [*SERVE, str(port)], health_url=f"http://127.0.0.1:{port}/health")
    with Supervisor(tmp_path) as supervisor:
        with pytest.raises(ComponentFailedError) as err:
            supervisor.start(web)
        assert supervisor.pids() == {}
    assert one_line(err.value) == (
        f"port 127.0.0.1:{port} is already in use by pid {decoy.pid} ({_comm(decoy.pid)}); "
        "not starting web"
    )
    assert "healthy" not in caplog.text


def test_the_supervisor_refuses_a_server_that_took_the_port_after_the_start(
    tmp_path: Path, port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The check before the start passed; another server binds the port while ours loads."""
    caplog.set_level(logging.INFO, logger="atroposlib.launcher")
    url = f"http://127.0.0.1:{port}/health"
    errors: list[ComponentFailedError] = []

    def start(supervisor: Supervisor) -> None:
        try:
            supervisor.start(Component("web", NEVER_SERVES, health_url=url, startup_timeout_s=30))
        except ComponentFailedError as exc:
            errors.append(exc)

    with Supervisor(tmp_path) as supervisor:
        thread = threading.Thread(target=start, args=(supervisor,))
        thread.start()
        deadline = time.monotonic() + 30
        while not (tmp_path / "logs" / "web.log").exists() and time.monotonic() < deadline:
            time.sleep(0.01)  # the log is opened after the port check, before the start
        with health_server(port) as decoy:
            thread.join(timeout=30)
    assert len(errors) == 1
    assert f"web: {url} answered, but port {port} is held by pid {decoy.pid} " in one_line(
        errors[0]
    )
    assert "healthy" not in caplog.text


def test_the_supervisor_passes_its_own_server(tmp_path: Path, port: int) -> None:
    with Supervisor(tmp_path) as supervisor:
        supervisor.start(Component("web", [*SERVE, str(port)],
                                   health_url=f"http://127.0.0.1:{port}/health"))  # fmt: skip
        assert supervisor.exited() == []


# ---- the trainer's VllmRestart, a plain HTTP server in place of vLLM ----


def test_vllm_restart_does_not_start_on_a_taken_port(
    port: int, decoy: subprocess.Popen[bytes]
) -> None:
    from example_trainer.weight_sync import VllmRestart

    url = f"http://127.0.0.1:{port}"
    command = f"{SERVE_COMMAND} {{port}} {{model}}"
    server = VllmRestart([url], command, retries=1, ready_timeout=30)
    try:
        with pytest.raises(RuntimeError) as err:
            server.start("/models/base")
        assert server.procs == {}
    finally:
        server.close()
    assert one_line(err.value) == (
        f"could not start inference server at {url}: port 127.0.0.1:{port} is already in use "
        f"by pid {decoy.pid} ({_comm(decoy.pid)}); not starting vLLM for {url}"
    )


def test_vllm_restart_starts_and_restarts_its_own_server(
    tmp_path: Path, port: int, caplog: pytest.LogCaptureFixture
) -> None:
    from example_trainer.weight_sync import VllmRestart

    url = f"http://127.0.0.1:{port}"
    command = f"{SERVE_COMMAND} {{port}} {{model}}"
    server = VllmRestart([url], command, retries=0, ready_timeout=30)
    try:
        server.start("/models/base")
        first = server.procs[url].pid
        with caplog.at_level(logging.WARNING):
            report = server.push(tmp_path, step=1)  # stops it, waits for the port, starts anew
            server.push(tmp_path, step=2)
        assert report.failed == {} and report.updated == [url]
        assert server.procs[url].pid != first
    finally:
        server.close()
    # this server has no /update_weight_version: said once, with the fix
    labels = [r.getMessage() for r in caplog.records if "VLLM_SERVER_DEV_MODE" in r.getMessage()]
    assert len(labels) == 1 and url in labels[0]


# ---- the OpenEnv adapter's local server ----


async def test_the_openenv_server_does_not_start_on_a_taken_port(
    tmp_path: Path, port: int, decoy: subprocess.Popen[bytes]
) -> None:
    server = LocalServer(f"{SERVE_COMMAND} {{port}}", tmp_path / "log", port)
    with pytest.raises(ConfigError) as err:
        await server.start(timeout_s=30)
    assert server.process is None
    assert one_line(err.value) == (
        f"port 127.0.0.1:{port} is already in use by pid {decoy.pid} ({_comm(decoy.pid)}); "
        "not starting the OpenEnv server command"
    )


async def test_the_openenv_server_passes_when_it_answers_itself(tmp_path: Path) -> None:
    server = LocalServer(f"{SERVE_COMMAND} {{port}}", tmp_path / "log")
    try:
        await server.start(timeout_s=30)
        assert server.process is not None and server.process.poll() is None
    finally:
        server.stop()


# ---- slurm/lib.sh, in real bash; srun runs its command here ----

FAKE_SRUN = """#!/usr/bin/env bash
while [[ $# -gt 0 && $1 == --* ]]; do shift; done
exec "$@"
"""


def run_lib(tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(stat.S_IRWXU)
    prologue = (f"source {REPO / 'slurm' / 'lib.sh'}\n"
                "trap 'kill \"${ATROPOS_PIDS[@]}\" 2>/dev/null; wait' EXIT\n")  # fmt: skip
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "LOG_DIR": str(tmp_path), "SLURM_JOB_ID": "77"}  # fmt: skip
    return subprocess.run(["bash", "-c", prologue + script], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_lib_sh_stops_the_job_before_a_launch_on_a_taken_port(
    tmp_path: Path, port: int, decoy: subprocess.Popen[bytes]
) -> None:
    done = run_lib(tmp_path, f"atropos_port_free web http://127.0.0.1:{port}\necho launched")
    assert done.returncode == 1 and "launched" not in done.stdout
    assert done.stderr.splitlines()[-1].endswith(
        f"[atropos] error: port 127.0.0.1:{port} is already in use; not starting web"
    )


def test_lib_sh_refuses_an_answer_from_a_process_outside_the_step(
    tmp_path: Path, port: int
) -> None:
    """The step was started (the port free then); another server took the port meanwhile."""
    url = f"http://127.0.0.1:{port}/health"
    with health_server(port) as decoy:
        holder = f"pid {decoy.pid} ({_comm(decoy.pid)})"
        done = run_lib(tmp_path, f"atropos_launch web 127.0.0.1 -- {shlex.join(NEVER_SERVES)}\n"
                                 f"atropos_wait_healthy web {url} 30")  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1].endswith(
        f"[atropos] error: web: {url} answered, but port 127.0.0.1:{port} is held by {holder}, "
        "not by web; stop that one or choose another port"
    )
    assert "web is healthy" not in done.stderr


def test_lib_sh_passes_the_step_it_started(tmp_path: Path, port: int) -> None:
    url = f"http://127.0.0.1:{port}"
    server = f"{SERVE_COMMAND} {port}"
    done = run_lib(tmp_path, f"atropos_port_free web {url}\n"
                             f"atropos_launch web 127.0.0.1 -- {server}\n"
                             f"atropos_wait_healthy web {url}/health 30")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "web is healthy" in done.stderr
