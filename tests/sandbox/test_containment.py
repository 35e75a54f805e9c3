"""Hostile programs stay contained in the isolation this host gives, as root included.

The table of issue 15: fork bomb, 10 GB allocation (and memory spread over processes), 2 GB
written across many files, infinite loop, /proc/1/environ and the parent's environ, a TCP connect
to a loopback listener, a unix-socket connect, killing the parent, writing outside the work
folder. Each test asserts both the sandbox's verdict and that the host saw nothing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_sandbox import _sandbox_processes

from atroposlib.sandbox import (
    Isolation,
    SandboxLimits,
    SandboxStatus,
    detect_isolation,
    forget_isolation,
    run_python,
)
from atroposlib.sandbox.proof import FORKS, TOGETHER
from atroposlib.sandbox.runner import namespace_probe_failure

LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=5, memory_mb=256, max_processes=16, disk_mb=32)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True, scope="module")
def namespaces_here() -> None:
    forget_isolation()  # an earlier test's probe may have met a broken supervisor or an overload
    assert detect_isolation() is Isolation.NAMESPACES, (
        f"this host should allow user namespaces: {namespace_probe_failure()}"
    )


@contextlib.contextmanager
def listener(family: int, address: object) -> Iterator[tuple[list[object], object]]:
    """A server socket that records every connection it accepts (and where it listens)."""
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind(address)
    server.listen()
    server.settimeout(0.2)
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                accepted.append(server.accept())

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        yield accepted, server.getsockname()
    finally:
        stop.set()
        thread.join()
        server.close()


def run(code: str, **limits: object) -> object:
    return run_python(textwrap.dedent(code), limits=LIMITS.model_copy(update=limits))


def test_runs_as_an_unprivileged_host_uid_without_capabilities() -> None:
    result = run("""
        status = open("/proc/self/status").read()
        print(open("/proc/self/uid_map").read().split()[1])
        print([line.split()[1] for line in status.splitlines() if line.startswith("CapEff")][0])
        print([line.split()[1] for line in status.splitlines() if line.startswith("Seccomp:")][0])
        """)
    host_uid, capabilities, seccomp = result.stdout.split()
    assert int(host_uid) != 0 and (os.geteuid() != 0 or int(host_uid) >= 2_000_000_000)
    assert int(capabilities, 16) == 0
    assert seccomp == "2"


def test_fork_bomb_is_held_to_max_processes_and_leaves_nothing() -> None:
    result = run(FORKS)  # the probe atropos-sandbox-check runs: fork 64 sleepers
    assert result.status is SandboxStatus.OK
    assert int(result.stdout) < LIMITS.max_processes  # with the program itself
    assert _sandbox_processes() == []


def test_ten_gigabytes_in_one_process_is_a_memory_error() -> None:
    result = run("x = bytearray(10 * 1024**3)")
    assert result.status is SandboxStatus.MEMORY


def test_memory_spread_over_processes_counts_together() -> None:
    result = run(TOGETHER)  # 4 processes x 100 MiB, each under RLIMIT_AS, 400 MiB together
    assert result.status is SandboxStatus.MEMORY
    assert result.stdout == ""


def test_two_gigabytes_across_many_files_stop_at_the_disk_limit() -> None:
    result = run("""
        import os
        written = 0
        try:
            for i in range(2048):
                with open(f"part{i}", "wb") as handle:
                    handle.write(os.urandom(2**20))
                written += 1
        except OSError as error:
            print(error.strerror)
        print(written)
        """)
    assert result.status is SandboxStatus.OK
    reason, written = result.stdout.splitlines()
    assert "No space left" in reason
    assert int(written) <= LIMITS.disk_mb


def test_infinite_loop_times_out() -> None:
    result = run("while True:\n    pass")
    assert result.status is SandboxStatus.TIMEOUT
    assert result.duration_s < LIMITS.wall_seconds + 5


def test_environ_of_pid_1_and_of_the_parent_are_out_of_reach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ATROPOS_CONTAINMENT_SECRET", "s3cr3t-value")
    result = run(f"""
        import os
        leaked = []
        pids = {{"1", str(os.getppid()), "{os.getpid()}", "{os.getppid()}"}}
        pids |= set(filter(str.isdigit, os.listdir("/proc")))
        for pid in sorted(pids):
            try:
                if b"s3cr3t" in open(f"/proc/{{pid}}/environ", "rb").read():
                    leaked.append(pid)
            except OSError:
                pass
        print("leaked", leaked)
        print(sorted(filter(str.isdigit, os.listdir("/proc"))))
        """)
    assert result.status is SandboxStatus.OK
    leaked, visible = result.stdout.splitlines()
    assert leaked == "leaked []"
    assert str(os.getpid()) not in visible  # the env is not even visible


def test_tcp_connect_to_a_loopback_listener_fails() -> None:
    with listener(socket.AF_INET, ("127.0.0.1", 0)) as (accepted, (_, port)):
        result = run(f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=2)
                print("connected")
            except OSError as error:
                print(type(error).__name__)
            """)
    assert result.stdout.strip() in ("PermissionError", "ConnectionRefusedError", "OSError")
    assert accepted == []


def test_unix_socket_of_the_host_cannot_be_reached() -> None:
    path = REPO / f".containment-{os.getpid()}.sock"
    try:
        with listener(socket.AF_UNIX, str(path)) as (accepted, _):
            path.chmod(0o777)  # permissions are not what stops it
            result = run(f"""
                import socket
                try:
                    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    client.connect({str(path)!r})
                    print("connected")
                except OSError as error:
                    print(type(error).__name__)
                """)
        assert result.stdout.strip() == "PermissionError"
        assert accepted == []
    finally:
        path.unlink(missing_ok=True)


def test_killing_the_parent_and_everything_else_leaves_the_host_alone() -> None:
    result = run(f"""
        import os, signal
        outcomes = []
        for pid in (os.getppid(), 1, {os.getpid()}, {os.getppid()}, -1):
            try:
                os.kill(pid, signal.SIGKILL)
                outcomes.append("sent")
            except OSError as error:
                outcomes.append(type(error).__name__)
        print(outcomes)
        """)
    assert result.status is SandboxStatus.OK  # the sandbox's own init ignores it; we are alive
    assert f"{os.getpid()}" not in result.stdout


def test_writing_outside_the_work_folder_fails_and_the_host_is_untouched(tmp_path: Path) -> None:
    keep = tmp_path / "keep.txt"
    keep.write_text("precious")
    outside = [str(keep), str(REPO / "pwned.txt"), "/etc/pwned", "/root/pwned", "/tmp/pwned",
               "/var/tmp/pwned", "/dev/shm/pwned", str(Path.home() / "pwned")]  # fmt: skip
    result = run(f"""
        import os
        escaped = []
        for path in {outside!r}:
            try:
                with open(path, "a") as handle:
                    handle.write("x")
                escaped.append(path)
            except OSError:
                pass
        open("inside.txt", "w").write("fine")
        print(escaped, open("inside.txt").read())
        """)
    assert result.stdout == "[] fine\n"
    assert keep.read_text() == "precious"
    assert not (REPO / "pwned.txt").exists() and not Path("/etc/pwned").exists()
