"""The sandbox contains hostile programs and reports each with the right status."""

from __future__ import annotations

import contextlib
import os
import socket
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from atroposlib.errors import SandboxError
from atroposlib.sandbox import (
    Isolation,
    SandboxLimits,
    SandboxStatus,
    arun_python,
    detect_isolation,
    forget_isolation,
    run_python,
)

FAST = SandboxLimits(cpu_seconds=1, wall_seconds=2, memory_mb=256, output_bytes=4096)
BOTH = [Isolation.AUDIT_HOOK, detect_isolation()]
MODES = sorted(set(BOTH), key=lambda mode: mode.value)


SANDBOX_UIDS = range(2_000_000_000, 2_000_000_000 + 2**24)


def _sandbox_processes() -> list[psutil.Process]:
    """This test run's supervisors, and anything under a sandbox uid (C, init, the program's
    tree, wherever it was reparented). Other engineers' runs on the machine are not ours.
    Under pytest-xdist (``scripts/test --all``) the other worker runs sandboxes at the same
    time, so only this worker's own tree is searched there; the default tier, run serially,
    also catches a program that escaped its tree."""
    mine = psutil.Process().children(recursive=True)
    found = [child for child in mine if "_supervisor.py" in " ".join(child.cmdline())]
    candidates = mine if "PYTEST_XDIST_WORKER" in os.environ else psutil.process_iter()
    for proc in candidates:
        with contextlib.suppress(psutil.NoSuchProcess):
            if proc.uids().real in SANDBOX_UIDS:
                found.append(proc)
    return found


@pytest.fixture(autouse=True)
def no_leftover_processes():
    yield
    deadline = time.monotonic() + 2
    while _sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sandbox_processes() == []


@pytest.mark.parametrize("isolation", MODES)
@pytest.mark.parametrize(
    ("code", "status", "stdout"),
    [
        ("print('hi')", SandboxStatus.OK, "hi\n"),
        ("x = 1", SandboxStatus.OK, ""),
        ("import sys; sys.exit(0)", SandboxStatus.OK, ""),
        ("def f(:\n    pass", SandboxStatus.SYNTAX_ERROR, ""),
        ("if True:\nprint(1)", SandboxStatus.SYNTAX_ERROR, ""),
        ("print('a')\nraise ValueError('boom')", SandboxStatus.RUNTIME_ERROR, "a\n"),
        ("import sys; sys.exit(3)", SandboxStatus.RUNTIME_ERROR, ""),
        (
            "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)",
            SandboxStatus.RUNTIME_ERROR,
            "",
        ),
        ("while True:\n    pass", SandboxStatus.TIMEOUT, ""),
        ("import time; time.sleep(60)", SandboxStatus.TIMEOUT, ""),
        ("x = bytearray(10 * 1024**3)", SandboxStatus.MEMORY, ""),
        ("x = [0] * (10**10)", SandboxStatus.MEMORY, ""),
    ],
)
def test_status_of_each_kind_of_program(isolation, code, status, stdout):
    result = run_python(code, limits=FAST, isolation=isolation)
    assert result.status is status, result.stderr_tail
    assert result.stdout == stdout
    assert result.isolation is isolation


@pytest.mark.parametrize("isolation", MODES)
def test_one_gigabyte_of_output_is_cut_off(isolation):
    code = "import sys\nchunk = 'x' * 2**20\nfor _ in range(1024):\n    sys.stdout.write(chunk)"
    started = time.monotonic()
    result = run_python(code, limits=FAST, isolation=isolation)
    assert result.status is SandboxStatus.OUTPUT_LIMIT
    assert len(result.stdout) == FAST.output_bytes
    # stopped at the cap, long before 1 GB went through (slack for a loaded machine)
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("isolation", MODES)
def test_stderr_flood_is_cut_off_and_only_its_tail_kept(isolation):
    code = "import sys\nwhile True:\n    sys.stderr.write('e' * 4096)"
    result = run_python(code, limits=FAST, isolation=isolation)
    assert result.status is SandboxStatus.OUTPUT_LIMIT
    assert 0 < len(result.stderr_tail) <= FAST.stderr_tail_bytes


@pytest.mark.parametrize("isolation", MODES)
def test_fork_bomb_is_contained_and_leaves_nothing(isolation):
    code = "import os\nwhile True:\n    os.fork()"
    result = run_python(code, limits=FAST, isolation=isolation)
    assert result.status in (SandboxStatus.TIMEOUT, SandboxStatus.RUNTIME_ERROR)
    # stopped by the wall limit, not left running (slack for a loaded machine's scheduling);
    # the autouse fixture checks nothing is left
    assert result.duration_s < FAST.wall_seconds + 10


@pytest.mark.parametrize("isolation", MODES)
def test_daemonised_child_does_not_outlive_the_run(isolation):
    code = textwrap.dedent(
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            time.sleep(30)
        print("parent done")
        """
    )
    result = run_python(code, limits=FAST, isolation=isolation)
    if isolation is Isolation.AUDIT_HOOK:
        assert result.status is SandboxStatus.RUNTIME_ERROR  # the audit hook refuses fork
        assert "blocked by the sandbox: os.fork" in result.stderr_tail
    else:
        assert result.status is SandboxStatus.OK
        assert result.stdout == "parent done\n"


@pytest.mark.parametrize("isolation", MODES)
def test_socket_to_the_host_is_refused(isolation):
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(3)
    port = server.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        with contextlib.suppress(TimeoutError):
            accepted.append(server.accept())

    thread = threading.Thread(target=accept)
    thread.start()
    code = (
        f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "print('in')"
    )
    result = run_python(code, limits=FAST, isolation=isolation)
    thread.join()
    server.close()
    assert result.status is SandboxStatus.RUNTIME_ERROR
    assert result.stdout == ""
    assert accepted == []


def test_files_outside_the_working_directory_are_unreadable_and_untouched(tmp_path: Path):
    isolation = detect_isolation()
    assert isolation is Isolation.NAMESPACES or os.geteuid() != 0, (
        "no namespaces and running as root: the sandbox cannot protect files on this host"
    )
    keep = tmp_path / "keep.txt"
    keep.write_text("precious")
    code = textwrap.dedent(
        f"""
        import os
        for action in (lambda: os.remove({str(keep)!r}),
                       lambda: os.remove({__file__!r}),
                       lambda: os.rename({str(tmp_path)!r}, {str(tmp_path) + "-moved"!r}),
                       lambda: open({str(tmp_path / "new.txt")!r}, 'w').write('x'),
                       lambda: open({str(keep)!r}, 'a').write('x')):
            try:
                action()
                print('escaped')
            except OSError:
                pass
        for secret in ({str(keep)!r}, os.path.expanduser("~root/.bash_history")):
            try:
                print("read", open(secret).read())
            except OSError:
                pass
        open('inside.txt', 'w').write('fine')
        print(open('inside.txt').read())
        """
    )
    result = run_python(code, limits=FAST, isolation=isolation)
    assert result.status is SandboxStatus.OK
    assert result.stdout == "fine\n"
    assert keep.read_text() == "precious"
    assert Path(__file__).is_file() and tmp_path.is_dir()
    assert not (tmp_path / "new.txt").exists()


def test_file_size_limit_turns_a_huge_write_into_an_error():
    limits = FAST.model_copy(update={"file_size_mb": 1})
    code = "open('big', 'wb').write(b'x' * (4 * 2**20))"
    result = run_python(code, limits=limits)
    assert result.status is SandboxStatus.RUNTIME_ERROR
    assert "File too large" in result.stderr_tail


def test_test_case_mode_reports_each_test():
    code = "def add(a, b):\n    return a + b"
    tests = [
        "assert add(1, 2) == 3",
        "assert add(2, 2) == 5",
        "while True: pass",
        "assert add(0, 0) == 0",
    ]
    limits = FAST.model_copy(update={"test_seconds": 0.5})
    result = run_python(code, tests=tests, limits=limits)
    assert result.status is SandboxStatus.OK
    assert result.tests_passed == [True, False, False, True]
    assert result.pass_rate == 0.5


def test_test_report_cannot_be_forged_by_the_program():
    code = textwrap.dedent(
        """
        import os, json
        for fd in range(3, 20):
            try:
                os.write(fd, json.dumps({'nonce': 'x', 'passed': [True]}).encode())
            except OSError:
                pass
        os._exit(0)
        """
    )
    result = run_python(code, tests=["assert False"], limits=FAST)
    assert result.tests_passed == [False]


def test_syntax_error_in_test_case_mode_is_a_syntax_error():
    result = run_python("def f(:", tests=["assert f()"], limits=FAST)
    assert result.status is SandboxStatus.SYNTAX_ERROR
    assert result.pass_rate == 0.0


async def test_async_runs_overlap():
    started = time.monotonic()
    import asyncio

    results = await asyncio.gather(
        *(arun_python("import time; time.sleep(1); print(1)") for _ in range(4))
    )
    assert [r.stdout for r in results] == ["1\n"] * 4
    # run one after another, the wall time would be at least the sum of their durations
    assert time.monotonic() - started < 0.8 * sum(r.duration_s for r in results)


def test_stdin_is_given_to_the_program():
    result = run_python("print(input()[::-1])", stdin="abc\n", limits=FAST)
    assert result.stdout == "cba\n"


def test_isolation_can_be_forced_by_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    forget_isolation()
    monkeypatch.setenv("ATROPOS_SANDBOX_ISOLATION", "audit_hook")
    try:
        assert detect_isolation() is Isolation.AUDIT_HOOK
        monkeypatch.setenv("ATROPOS_SANDBOX_ISOLATION", "chroot")
        forget_isolation()
        with pytest.raises(SandboxError, match="use one of namespaces, audit_hook"):
            detect_isolation()
    finally:
        forget_isolation()


def fake_probe(
    monkeypatch: pytest.MonkeyPatch, answers: list[SandboxStatus | SandboxError]
) -> list[float]:
    """The namespace probe answers ``answers`` in turn; returns the wall limits it was given."""
    from atroposlib.sandbox import runner
    from atroposlib.sandbox.models import SandboxResult

    walls: list[float] = []

    def probe(code: str, **kwargs: Any) -> SandboxResult:
        walls.append(kwargs["limits"].wall_seconds)
        answer = answers.pop(0)
        if isinstance(answer, SandboxError):
            raise answer
        out = "ok\n" if answer is SandboxStatus.OK else ""
        return SandboxResult(status=answer, stdout=out, stderr_tail="", duration_s=1.0,
                             exit_code=0, isolation=Isolation.NAMESPACES)  # fmt: skip

    monkeypatch.delenv("ATROPOS_SANDBOX_ISOLATION", raising=False)
    monkeypatch.setattr(runner, "run_python", probe)
    monkeypatch.setattr(runner, "PROBE_PAUSE_S", 0.0)
    forget_isolation()
    return walls


def test_a_namespace_probe_that_failed_for_a_passing_reason_is_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A loaded machine can take longer than a run's default wall limit to start the probe, or
    fail it otherwise once; a fallback verdict stands for minutes, so one failure is not taken
    as "no namespaces"."""
    from atroposlib.sandbox import runner

    overloaded = SandboxError("the sandbox supervisor did not report in time (host overload?)")
    walls = fake_probe(monkeypatch, [SandboxStatus.TIMEOUT, overloaded, SandboxStatus.OK])
    try:
        assert detect_isolation() is Isolation.NAMESPACES
    finally:
        forget_isolation()
    assert walls == [runner.PROBE_WALL_S] * 3 and runner.PROBE_WALL_S > SandboxLimits().wall_seconds


def test_a_host_that_refuses_namespaces_every_time_gets_the_fallback_with_its_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from atroposlib.sandbox import runner

    refused = SandboxError("the sandbox could not start: unshare: Operation not permitted")
    fake_probe(monkeypatch, [refused] * runner.PROBE_TRIES)
    try:
        assert detect_isolation() is Isolation.AUDIT_HOOK
    finally:
        forget_isolation()
    assert "unshare: Operation not permitted" in caplog.text


def test_a_fallback_verdict_is_probed_again_later_and_namespaces_stand(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A long-running environment does not keep the weak fallback for its whole life after one
    overloaded moment; once namespaces are found they are not probed again."""
    from atroposlib.sandbox import runner

    refused = SandboxError("the sandbox supervisor did not report in time (host overload?)")
    walls = fake_probe(monkeypatch, [refused] * runner.PROBE_TRIES + [SandboxStatus.OK])
    clock = [1000.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])
    try:
        assert detect_isolation() is Isolation.AUDIT_HOOK
        clock[0] += runner.FALLBACK_RECHECK_S - 1
        assert detect_isolation() is Isolation.AUDIT_HOOK  # not probed again yet
        assert len(walls) == runner.PROBE_TRIES
        clock[0] += 2
        assert detect_isolation() is Isolation.NAMESPACES
        clock[0] += 10 * runner.FALLBACK_RECHECK_S
        assert detect_isolation() is Isolation.NAMESPACES
        assert len(walls) == runner.PROBE_TRIES + 1
    finally:
        forget_isolation()
