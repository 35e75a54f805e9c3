"""The supervisor waits for health, reports failures with logs, and leaves no process behind."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from atroposlib.launcher import Component, ComponentFailedError, Supervisor
from tests.fakes import free_port

SPAWNS_GRANDCHILD = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"
)

SLOW_SERVER = textwrap.dedent(
    """
    import http.server, signal, sys, time
    time.sleep(0.5)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    handler = http.server.SimpleHTTPRequestHandler
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), handler).serve_forever()
    """
)


def test_start_waits_for_health_and_stop_all_leaves_nothing(tmp_path: Path) -> None:
    port = free_port()
    with Supervisor(tmp_path) as supervisor:
        supervisor.start(
            Component(
                "web",
                [sys.executable, "-c", SLOW_SERVER, str(port)],
                health_url=f"http://127.0.0.1:{port}/",
                startup_timeout_s=30,
            )
        )
        # a child that spawns its own child: the whole process group must go
        supervisor.start(
            Component(
                "tree",
                [
                    sys.executable,
                    "-c",
                    SPAWNS_GRANDCHILD,
                ],
            )
        )
        time.sleep(0.5)
        pids = set(supervisor.pids().values())
        pids |= {c.pid for pid in pids for c in psutil.Process(pid).children(recursive=True)}
        assert supervisor.exited() == []
    time.sleep(0.2)
    alive = [
        pid
        for pid in pids
        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ]
    assert alive == []
    assert (tmp_path / "logs" / "web.log").exists()


def test_component_that_dies_during_startup_reports_its_log(tmp_path: Path) -> None:
    script = "import sys; print('model folder not found: /nope'); sys.exit(3)"
    with Supervisor(tmp_path) as supervisor, pytest.raises(ComponentFailedError) as err:
        supervisor.start(
            Component(
                "inference",
                [sys.executable, "-c", script],
                health_url=f"http://127.0.0.1:{free_port()}/health",
            )
        )
    assert "code 3" in str(err.value)
    assert "model folder not found" in str(err.value)


def test_component_that_never_gets_healthy_times_out(tmp_path: Path) -> None:
    with (
        Supervisor(tmp_path) as supervisor,
        pytest.raises(ComponentFailedError, match="did not answer"),
    ):
        supervisor.start(
            Component(
                "sleeper",
                [sys.executable, "-c", "import time; time.sleep(60)"],
                health_url=f"http://127.0.0.1:{free_port()}/",
                startup_timeout_s=1.0,
            )
        )


def test_the_run_key_reaches_every_component_in_its_environment_not_its_argv(
    tmp_path: Path,
) -> None:
    from atroposlib.cli.local import run_key_environment

    key = "run-key-abc"
    show = "import os; print(os.environ['ATROPOS_API_KEY'], os.environ['ATROPOS_OPENAI__API_KEY'])"
    with Supervisor(tmp_path, env=run_key_environment(key)) as supervisor:
        for name in ("broker", "trainer"):
            supervisor.start(Component(name, [sys.executable, "-c", show]))
        for name in ("broker", "trainer"):
            assert supervisor.wait(name, timeout_s=60) == 0
            assert supervisor.log_tail(name).split() == [key, key]
            assert not any(key in arg for arg in supervisor._find(name).component.argv)
