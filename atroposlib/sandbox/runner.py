"""Runs untrusted Python in a separate, limited process and reports how it ended."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from atroposlib.errors import SandboxError
from atroposlib.sandbox.models import Isolation, SandboxLimits, SandboxResult, SandboxStatus

logger = logging.getLogger(__name__)

_SUPERVISOR = Path(__file__).with_name("_supervisor.py")
_UNSHARE = ("--user", "--map-root-user", "--net", "--pid", "--mount", "--fork", "--kill-child")
_EXIT_STATUS = {
    0: SandboxStatus.OK,
    1: SandboxStatus.RUNTIME_ERROR,
    2: SandboxStatus.SYNTAX_ERROR,
    3: SandboxStatus.MEMORY,
    64 + signal.SIGXCPU: SandboxStatus.TIMEOUT,
    64 + signal.SIGKILL: SandboxStatus.TIMEOUT,
}
_EXIT_SETUP_FAILED = 70


def run_python(
    code: str,
    *,
    limits: SandboxLimits | None = None,
    tests: list[str] | None = None,
    stdin: str = "",
    isolation: Isolation | None = None,
) -> SandboxResult:
    """Run ``code`` as a program in the sandbox; with ``tests``, run each after it (pass rate).

    Each test is a snippet (usually ``assert ...``) run in the program's namespace with its own
    time limit; ``SandboxResult.tests_passed`` holds one outcome per test.
    """
    limits = limits or SandboxLimits()
    isolation = isolation or detect_isolation()
    root = Path(tempfile.mkdtemp(prefix="atropos-sandbox-"))
    try:
        return _run(code, tests or [], stdin, limits, isolation, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def arun_python(
    code: str,
    *,
    limits: SandboxLimits | None = None,
    tests: list[str] | None = None,
    stdin: str = "",
    isolation: Isolation | None = None,
) -> SandboxResult:
    """:func:`run_python` in a worker thread, for environments' async hooks."""
    return await asyncio.to_thread(
        run_python, code, limits=limits, tests=tests, stdin=stdin, isolation=isolation
    )


@functools.cache
def detect_isolation() -> Isolation:
    """Namespaces when ``unshare`` can create them here (checked once), else the audit hook.

    ``ATROPOS_SANDBOX_ISOLATION=audit_hook`` (or ``namespaces``) skips the check.
    """
    forced = os.environ.get("ATROPOS_SANDBOX_ISOLATION")
    if forced:
        try:
            return Isolation(forced)
        except ValueError:
            choices = ", ".join(mode.value for mode in Isolation)
            raise SandboxError(
                f"ATROPOS_SANDBOX_ISOLATION={forced!r}: use one of {choices}"
            ) from None
    reason = "unshare is not installed"
    if shutil.which("unshare") is not None:
        try:
            probe = run_python("print('ok')", isolation=Isolation.NAMESPACES)
            if probe.status is SandboxStatus.OK and probe.stdout == "ok\n":
                return Isolation.NAMESPACES
            reason = probe.stderr_tail.strip() or probe.status.value
        except SandboxError as error:
            reason = str(error)
    logger.warning(
        "code sandbox falls back to an audit hook (%s): no network isolation for native code "
        "and only the host's file permissions protect files%s",
        reason,
        " (running as root: files are NOT protected)" if os.geteuid() == 0 else "",
    )
    return Isolation.AUDIT_HOOK


def hidden_directories() -> list[str]:
    """Directories the program sees empty: homes and temporary directories (other users'
    files, credentials), except the Python installation the program runs on."""
    candidates = [Path.home(), Path("/root"), Path("/home"), Path(tempfile.gettempdir()),
                  Path("/tmp"), Path("/var/tmp"), Path("/dev/shm")]  # fmt: skip
    return sorted({str(path) for path in candidates if path.is_dir()})


def _run(
    code: str,
    tests: list[str],
    stdin: str,
    limits: SandboxLimits,
    isolation: Isolation,
    root: Path,
) -> SandboxResult:
    workdir = root / "work"
    workdir.mkdir()
    (root / "stdin").write_text(stdin, encoding="utf-8")
    nonce = secrets.token_hex(16)
    report_read, report_write = os.pipe() if tests else (-1, -1)
    spec = {
        "code": code,
        "tests": tests,
        "workdir": str(workdir),
        "limits": limits.model_dump(),
        "test_seconds": limits.test_seconds,
        "namespaces": isolation is Isolation.NAMESPACES,
        "hidden": hidden_directories(),
        "nonce": nonce,
        "report_fd": report_write if tests else None,
    }
    (root / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    command = [sys.executable, "-I", str(_SUPERVISOR), str(root / "spec.json")]
    if isolation is Isolation.NAMESPACES:
        command = ["unshare", *_UNSHARE, *command]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir),
           "TMPDIR": str(workdir), "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}  # fmt: skip
    started = time.monotonic()
    with open(root / "stdin", "rb") as stdin_file:
        process = subprocess.Popen(
            command, stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=workdir, env=env, start_new_session=True,
            pass_fds=(report_write,) if tests else (),
        )  # fmt: skip
    if tests:
        os.close(report_write)
    try:
        stdout, stderr, report, killed_for = _collect(process, limits, report_read, started)
    finally:
        _kill_group(process)
        if tests:
            os.close(report_read)
        if isolation is Isolation.AUDIT_HOOK:
            _kill_strays(str(root))
    duration = time.monotonic() - started
    exit_code = process.returncode if killed_for is None else None
    if exit_code == _EXIT_SETUP_FAILED:
        raise SandboxError(f"the sandbox could not start: {stderr.decode(errors='replace')}")
    status = killed_for or _EXIT_STATUS.get(exit_code or 0, SandboxStatus.RUNTIME_ERROR)
    return SandboxResult(
        status=status,
        stdout=stdout[: limits.output_bytes].decode("utf-8", errors="replace"),
        stderr_tail=stderr[-limits.stderr_tail_bytes :].decode("utf-8", errors="replace"),
        duration_s=round(duration, 4),
        exit_code=exit_code,
        isolation=isolation,
        tests_passed=_read_report(report, nonce, len(tests)) if tests else None,
    )


def _collect(
    process: subprocess.Popen[bytes], limits: SandboxLimits, report_fd: int, started: float
) -> tuple[bytes, bytes, bytes, SandboxStatus | None]:
    """Read stdout, stderr and the test report until exit, a limit, or the wall deadline."""
    assert process.stdout is not None and process.stderr is not None
    buffers: dict[int, bytearray] = {}
    caps = {
        process.stdout.fileno(): limits.output_bytes,
        process.stderr.fileno(): max(limits.output_bytes, limits.stderr_tail_bytes) * 16,
    }
    with selectors.DefaultSelector() as selector:
        for fd in (process.stdout.fileno(), process.stderr.fileno(), report_fd):
            if fd >= 0:
                selector.register(fd, selectors.EVENT_READ)
                buffers[fd] = bytearray()
        killed_for: SandboxStatus | None = None
        while selector.get_map():
            remaining = started + limits.wall_seconds - time.monotonic()
            if remaining <= 0:
                killed_for = SandboxStatus.TIMEOUT
                break
            for key, _ in selector.select(timeout=remaining):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                buffers[key.fd] += chunk
                if len(buffers[key.fd]) > caps.get(key.fd, 1 << 20):
                    killed_for = SandboxStatus.OUTPUT_LIMIT
            if killed_for is not None:
                break
    if killed_for is None:
        try:
            process.wait(timeout=max(0.1, started + limits.wall_seconds - time.monotonic()))
        except subprocess.TimeoutExpired:
            killed_for = SandboxStatus.TIMEOUT
    out, err = buffers[process.stdout.fileno()], buffers[process.stderr.fileno()]
    return bytes(out), bytes(err), bytes(buffers.get(report_fd, b"")), killed_for


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            logger.debug("sandbox process group %d already gone", process.pid)
    process.wait()
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def _kill_strays(marker: str) -> None:
    """Audit-hook mode has no PID namespace: kill processes that still carry the spec path."""
    for proc in psutil.process_iter(["cmdline"]):
        if any(marker in part for part in proc.info["cmdline"] or ()):
            try:
                proc.kill()
            except psutil.Error as error:
                logger.debug("could not kill stray sandbox process %d: %s", proc.pid, error)


def _read_report(report: bytes, nonce: str, count: int) -> list[bool]:
    try:
        data = json.loads(report)
    except ValueError:
        return [False] * count
    passed = data.get("passed") if isinstance(data, dict) else None
    if data.get("nonce") != nonce or not isinstance(passed, list) or len(passed) != count:
        return [False] * count
    return [outcome is True for outcome in passed]
