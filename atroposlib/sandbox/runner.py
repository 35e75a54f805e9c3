"""Runs untrusted Python under the sandbox's supervisor and turns its report into results.

The supervisor (``_supervisor.py``, a separate trusted process) confines the program, enforces
the limits and, in test-case mode, judges the tests itself; this module only starts it, hands it
the program, the tests and the limits through memory files, and reads the report from a pipe no
sandboxed process holds. A failure of the sandbox itself (cannot start, killed by the host, disk
full) raises :class:`~atroposlib.errors.SandboxError`: it is never the program's score.
"""

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
import site
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from atroposlib.errors import SandboxError
from atroposlib.sandbox.models import Isolation, SandboxLimits, SandboxResult, SandboxStatus
from atroposlib.sandbox.seccomp import compiled_filter

logger = logging.getLogger(__name__)
_SUPERVISOR = Path(__file__).with_name("_supervisor.py")
_HOST_IDS = (2_000_000_000, 2**24)  # base, count: unprivileged uids no account on a host owns
_GRACE_SECONDS = 10.0
_NAMESPACE_WORKDIR = "/tmp/atropos-sandbox"
# no user site, no site (its .pth files cost ~15 ms), not the cwd on sys.path; the environment
# is ours (not -E), so PYTHONHASHSEED applies
PYTHON_FLAGS = ("-s", "-S", "-P")


def run_python(
    code: str,
    *,
    limits: SandboxLimits | None = None,
    tests: Sequence[str] | None = None,
    stdin: str = "",
    isolation: Isolation | None = None,
    test_setup: str = "",
    solution_names: Sequence[str] = (),
    hash_seed: int | None = None,
) -> SandboxResult:
    """Run ``code`` as a program in the sandbox; with ``tests``, judge each after it.

    Each test (``assert f(2) == 4``, or HumanEval's ``check(candidate)``) runs in the trusted
    supervisor, not next to the program: names it reads from the program (functions, values)
    are called there as remote functions that return only plain data. ``test_setup`` is trusted
    code run before the tests in the supervisor (a benchmark's imports and helpers);
    ``solution_names`` are taken from the program even when ``test_setup`` defines them (the
    function under test). ``hash_seed`` fixes ``PYTHONHASHSEED`` (default: random).
    """
    limits = limits or SandboxLimits()
    if tests:
        tests_spec = {"tests": list(tests), "setup": test_setup,
                      "solution_names": list(solution_names)}  # fmt: skip
        report = _supervise(code, "tests", [stdin], limits, isolation, hash_seed, tests_spec)
    else:
        report = _supervise(code, "program", [stdin], limits, isolation, hash_seed, None)
    return report[0]


def run_io(
    code: str,
    inputs: Sequence[str],
    *,
    limits: SandboxLimits | None = None,
    isolation: Isolation | None = None,
    hash_seed: int | None = None,
) -> list[SandboxResult]:
    """Run ``code`` once per input (a fresh sandboxed process each); one result per input.
    The expected outputs stay with the caller, who compares them with ``stdout``."""
    limits = limits or SandboxLimits()
    return _supervise(code, "program", list(inputs), limits, isolation, hash_seed, None)


async def arun_python(code: str, **kwargs: Any) -> SandboxResult:
    """:func:`run_python` in a worker thread, for environments' async hooks."""
    return await asyncio.to_thread(run_python, code, **kwargs)


async def arun_io(code: str, inputs: Sequence[str], **kwargs: Any) -> list[SandboxResult]:
    """:func:`run_io` in a worker thread."""
    return await asyncio.to_thread(run_io, code, inputs, **kwargs)


def hidden_directories() -> list[str]:
    """Directories the program sees empty: homes and temporary directories (other users'
    files, credentials), except the Python installation the program runs on."""
    candidates = [Path.home(), Path("/root"), Path("/home"), Path(tempfile.gettempdir()),
                  Path("/tmp"), Path("/var/tmp"), Path("/dev/shm")]  # fmt: skip
    return sorted({str(path) for path in candidates if path.is_dir()})


PROBE_WALL_S = 60.0
PROBE_TRIES = 3
PROBE_PAUSE_S = 1.0
FALLBACK_RECHECK_S = 600.0
"""The namespace probe's wall limit, tries and pause between them, and how long a fallback
verdict stands before the next run probes again (namespaces, once found, stand for the
process's life). A loaded machine has failed the probe for a passing reason (CI, 2026-12-03: a
start over the default 10 s), and a long-running environment must not keep the weak fallback
for days after one such moment. A host without namespaces refuses at once, every time."""

_verdict: dict[str, tuple[Isolation, float]] = {}


def namespace_probe_failure() -> str | None:
    """None when a program runs inside the sandbox's namespaces here, else the last try's reason."""
    limits = SandboxLimits(wall_seconds=PROBE_WALL_S)
    reason = "not tried"
    for attempt in range(PROBE_TRIES):
        if attempt:
            time.sleep(PROBE_PAUSE_S)
        try:
            probe = run_python("print('ok')", isolation=Isolation.NAMESPACES, limits=limits)
        except SandboxError as error:
            reason = str(error)
            continue
        if probe.status is SandboxStatus.OK and probe.stdout == "ok\n":
            return None
        reason = probe.stderr_tail.strip() or probe.status.value
    return reason


def detect_isolation() -> Isolation:
    """Namespaces when this host lets the sandbox create them, else the weak audit-hook
    fallback (probed again after ``FALLBACK_RECHECK_S``). ``ATROPOS_SANDBOX_ISOLATION=audit_hook``
    (or ``namespaces``) forces one.
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
    known = _verdict.get("probed")
    if known is not None:
        isolation, since = known
        if isolation is Isolation.NAMESPACES or time.monotonic() - since < FALLBACK_RECHECK_S:
            return isolation
    reason = namespace_probe_failure()
    if reason is None:
        isolation = Isolation.NAMESPACES
    else:
        logger.warning("code sandbox: namespaces unavailable (%s); using the weak audit-hook "
                       "fallback for %.0f s (atropos-sandbox-check tells more)",
                       reason[-300:], FALLBACK_RECHECK_S)  # fmt: skip
        isolation = Isolation.AUDIT_HOOK
    _verdict["probed"] = (isolation, time.monotonic())
    return isolation


def forget_isolation() -> None:
    """Drop the probe's verdict: the next run probes again."""
    _verdict.clear()


def sandbox_host_id(isolation: Isolation) -> int | None:
    """The host uid a run's processes get: a fresh unprivileged one when running as root,
    else None (the caller's own uid, the only one an unprivileged user can map). Without
    namespaces that uid must reach the Python installation through the host's permissions."""
    if os.geteuid() != 0:
        return None
    if isolation is Isolation.AUDIT_HOOK and not _installation_reachable():
        return None
    base, count = _HOST_IDS
    return base + secrets.randbelow(count)


@functools.cache
def _installation_reachable() -> bool:
    for start in {sys.base_prefix, sys.prefix, *_site_packages()}:
        path = Path(start).resolve()
        if any(not part.stat().st_mode & 0o001 for part in (path, *path.parents)):
            return False
    return True


def _supervise(
    code: str,
    mode: str,
    stdins: list[str],
    limits: SandboxLimits,
    isolation: Isolation | None,
    hash_seed: int | None,
    tests: dict[str, Any] | None,
) -> list[SandboxResult]:
    isolation = isolation or detect_isolation()
    spaced = isolation is Isolation.NAMESPACES
    root: Path | None = None
    try:
        host_id = sandbox_host_id(isolation)
        if spaced:  # the work folder is a tmpfs that exists only inside the namespace
            workdir = _NAMESPACE_WORKDIR
        else:
            root = Path(tempfile.mkdtemp(prefix="atropos-sandbox-"))
            workdir = str(root / "work")
            os.mkdir(workdir)
            if host_id is not None:
                os.chown(workdir, host_id, host_id)
                root.chmod(0o711)
        spec = {"code": code, "mode": mode, "stdins": stdins, "limits": limits.model_dump(),
                "workdir": workdir, "namespaces": spaced, "host_id": host_id,
                "hidden": hidden_directories(), "seccomp": compiled_filter().hex(),
                "site_packages": _site_packages()}  # fmt: skip
        budget = len(stdins) * (limits.wall_seconds + 1) + _GRACE_SECONDS
        report = _start_and_read(spec, tests, workdir, hash_seed, budget)
    except OSError as error:
        raise SandboxError(f"the sandbox could not run: {error}") from error
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
    return _results(report, limits, isolation, len(stdins), len(tests["tests"]) if tests else 0)


@functools.cache
def _site_packages() -> list[str]:
    """Where the program finds installed packages (the supervisor starts without ``site``)."""
    return [path for path in site.getsitepackages() if os.path.isdir(path)]


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)  # close-on-exec; pass_fds hands it to the supervisor only
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _start_and_read(
    spec: dict[str, Any], tests: dict[str, Any] | None, workdir: str, hash_seed: int | None,
    budget: float,
) -> dict[str, Any]:  # fmt: skip
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": workdir, "TMPDIR": workdir,
           "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
           "PYTHONHASHSEED": "random" if hash_seed is None else str(hash_seed)}  # fmt: skip
    spec_fd = _memfd("spec", json.dumps(spec).encode())
    tests_fd = _memfd("tests", json.dumps(tests or {}).encode())
    report_r, report_w = os.pipe()
    fds = (spec_fd, tests_fd, report_w)
    try:
        process = subprocess.Popen(
            [sys.executable, *PYTHON_FLAGS, str(_SUPERVISOR), *map(str, fds)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd="/",
            env=env,
            pass_fds=fds,
            start_new_session=True,
        )
    finally:
        for fd in fds:
            os.close(fd)
    try:
        report, stderr = _read_report(process, report_r, time.monotonic() + budget)
    finally:
        os.close(report_r)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    if process.returncode != 0 or not report:
        why = f"exit status {process.returncode}" if report else "no report"
        raise SandboxError(f"the sandbox supervisor failed ({why}): {stderr[-2000:]}")
    data: dict[str, Any] = json.loads(report)
    if "setup_failed" in data:
        raise SandboxError(f"the sandbox could not start: {data['setup_failed']}")
    return data


def _read_report(
    process: subprocess.Popen[bytes], report_fd: int, deadline: float
) -> tuple[bytes, str]:
    assert process.stderr is not None
    stderr_fd = process.stderr.fileno()
    buffers = {report_fd: bytearray(), stderr_fd: bytearray()}
    with selectors.DefaultSelector() as selector:
        for fd in buffers:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                os.killpg(process.pid, signal.SIGKILL)
                raise SandboxError("the sandbox supervisor did not report in time (host overload?)")
            for key, _ in selector.select(timeout=remaining):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    buffers[key.fd] += chunk
                else:
                    selector.unregister(key.fd)
    process.stderr.close()
    process.wait()  # its stderr closed: it has exited
    stderr = buffers[stderr_fd].decode(errors="replace")
    return bytes(buffers[report_fd]), stderr


def _results(
    report: dict[str, Any], limits: SandboxLimits, isolation: Isolation, count: int, tests: int
) -> list[SandboxResult]:
    if "syntax_error" in report:
        tail = str(report["syntax_error"])[-limits.stderr_tail_bytes :]
        syntax = SandboxResult(status=SandboxStatus.SYNTAX_ERROR, stdout="", stderr_tail=tail,
                               duration_s=0.0, exit_code=None, isolation=isolation,
                               tests_passed=[False] * tests if tests else None)  # fmt: skip
        return [syntax] * count
    passed = report.get("tests_passed")
    return [
        SandboxResult(**run, isolation=isolation, tests_passed=passed) for run in report["runs"]
    ]
