"""The trusted supervisor of one sandboxed run: starts confined workers, drains their output,
enforces the limits the kernel does not, and (with tests) judges them. Model code never runs here.

Started by :mod:`atroposlib.sandbox.runner` as ``python -s -S -P _supervisor.py SPEC_FD TESTS_FD
REPORT_FD`` (standard library only, no atroposlib import). Each worker (:mod:`_spawn`) runs in
fresh user/mount/PID/network/IPC/UTS namespaces whose root this process maps to an unprivileged
host uid, under the namespace's own init, so every process the program starts dies with it. The
verdict travels only through ``REPORT_FD``, which no worker holds; the tests are read from
``TESTS_FD`` only after the first worker was forked, so no forked worker's memory holds them.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import sys
import time
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -P leaves the script's folder out
import _confine
import _judge
import _wire
from _spawn import EXIT_SIGNAL_BASE, Sandbox, SetupFailed, kill_every_process_of

_STATUS_BY_EXIT = {0: "ok", 1: "runtime_error", 3: "memory"}
_PAGE = os.sysconf("SC_PAGE_SIZE")
_WATCH_INTERVAL_S = 0.05


class Worker:
    """One confined process tree running the program, as the supervisor sees it."""

    def __init__(self, sandbox: Sandbox, stdin: bytes, serve: bool, fresh: bool) -> None:
        self.limits = sandbox.limits
        self.started = time.monotonic()
        self.stdout, self.stderr = bytearray(), bytearray()
        self.frames = _wire.FrameReader()
        self.killed_for: str | None = None
        self.exit_code: int | None = None
        self.child_pid, self.init_pid, fds = sandbox.spawn(stdin, serve, fresh)
        self.stdout_fd, self.stderr_fd, self.request_fd, self.response_fd = fds
        self.selector = selectors.DefaultSelector()
        for fd in (self.stdout_fd, self.stderr_fd, self.response_fd):
            if fd >= 0:
                self.selector.register(fd, selectors.EVENT_READ)
        self.namespaces, self.host_id = sandbox.namespaces, sandbox.host_id
        self.next_watch = self.started + _WATCH_INTERVAL_S

    @property
    def alive(self) -> bool:
        return self.exit_code is None and self.killed_for is None

    def pump(self, until: float, want_frame: bool = False) -> dict[str, Any] | None:
        """Drain output until ``until``, the process's end, or (``want_frame``) a frame."""
        while self.alive:
            if want_frame and (message := self._next_frame()) is not None:
                return message
            if not self.alive:
                break
            now = time.monotonic()
            if now >= until:
                return None
            if now >= self.next_watch:
                self._watch_memory()
                self.next_watch = now + _WATCH_INTERVAL_S
                continue
            if not self.selector.get_map():
                self._reap(block_until=min(until, self.next_watch))
                continue
            timeout = min(until, self.next_watch) - now
            for key, _ in self.selector.select(timeout=max(0.0, timeout)):
                if self.alive:
                    self._read(key.fd)
        return self._next_frame() if want_frame else None

    def _next_frame(self) -> dict[str, Any] | None:
        try:
            return self.frames.next()
        except _wire.WireError:  # the program wrote garbage on the channel: it is done
            self.kill(None)
            return None

    def _read(self, fd: int) -> None:
        chunk = os.read(fd, 65536)
        if not chunk:
            self.selector.unregister(fd)
            return
        if fd == self.response_fd:
            self.frames.feed(chunk)
            return
        buffer = self.stdout if fd == self.stdout_fd else self.stderr
        cap = self.limits["output_bytes"] if fd == self.stdout_fd else self.stderr_cap
        buffer += chunk
        if len(buffer) > cap:
            self.kill("output_limit")

    @property
    def stderr_cap(self) -> int:
        return max(self.limits["output_bytes"], self.limits["stderr_tail_bytes"]) * 16

    def _reap(self, block_until: float) -> None:
        while time.monotonic() < block_until:
            pid, status = os.waitpid(self.child_pid, os.WNOHANG)
            if pid:
                self.exit_code = os.waitstatus_to_exitcode(status)
                self._close()
                return
            time.sleep(0.002)

    def wait(self, until: float) -> None:
        """Until the program ends (or ``until``: then it is killed as a timeout)."""
        self.pump(until)
        if self.alive:
            self.kill("timeout")

    def _watch_memory(self) -> None:
        """The program's processes together stay under ``memory_mb`` (RLIMIT_AS binds only
        each one): the resident memory of the whole tree, read from /proc."""
        if not self.namespaces or self.init_pid <= 0:
            return
        total, pending, seen = 0, [self.init_pid], set()
        while pending:
            pid = pending.pop()
            if pid in seen:
                continue
            seen.add(pid)
            try:
                with open(f"/proc/{pid}/statm", "rb") as handle:
                    total += int(handle.read().split()[1]) * _PAGE
                for task in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                        pending.extend(int(child) for child in handle.read().split())
            except (OSError, ValueError, IndexError):
                continue
        if total > self.limits["memory_mb"] * 1024 * 1024:
            self.kill("memory")

    def kill(self, reason: str | None) -> None:
        """End every process of the run: the namespace's init takes them all with it (and ``C``,
        which waits for it, then exits); without namespaces, C's process group and, as root,
        every process of the run's uid."""
        if self.killed_for is None and self.exit_code is None:
            self.killed_for = reason
        if self.exit_code is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, signal.SIGKILL)
            if not self.namespaces:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.child_pid, signal.SIGKILL)
                if self.host_id:
                    kill_every_process_of(self.host_id)
            os.waitpid(self.child_pid, 0)
            self.exit_code = -signal.SIGKILL
        self._close()

    def _close(self) -> None:
        for fd in (self.stdout_fd, self.stderr_fd, self.response_fd, self.request_fd):
            if fd >= 0:
                if fd in self.selector.get_map():
                    self.selector.unregister(fd)
                os.close(fd)
        self.stdout_fd = self.stderr_fd = self.response_fd = self.request_fd = -1

    def status(self) -> str:
        if self.killed_for is not None:
            return self.killed_for
        code = self.exit_code or 0
        if code >= EXIT_SIGNAL_BASE and code - EXIT_SIGNAL_BASE in (signal.SIGXCPU, signal.SIGKILL):
            return "timeout"
        return _STATUS_BY_EXIT.get(code, "runtime_error")

    def report(self) -> dict[str, Any]:
        tail = self.limits["stderr_tail_bytes"]
        return {
            "status": self.status(),
            "stdout": bytes(self.stdout[: self.limits["output_bytes"]]).decode(errors="replace"),
            "stderr_tail": bytes(self.stderr[-tail:] if tail else b"").decode(errors="replace"),
            "duration_s": round(time.monotonic() - self.started, 4),
            "exit_code": None if self.killed_for else self.exit_code,
        }


def _read_fd(fd: int) -> dict[str, Any]:
    with os.fdopen(fd, "rb") as handle:
        data: dict[str, Any] = json.loads(handle.read())
    return data


def run(spec: dict[str, Any], tests_fd: int) -> dict[str, Any]:
    try:
        program = compile(spec["code"], "solution.py", "exec")
    except Exception:  # SyntaxError, or RecursionError/MemoryError on absurd nesting: the
        # program's fault, never the sandbox's (that would drop the group instead of scoring it)
        return {"syntax_error": traceback.format_exc(limit=0)}
    sandbox = Sandbox(spec, program)
    limits = spec["limits"]
    if spec["mode"] == "tests":
        worker = Worker(sandbox, b"", serve=True, fresh=False)
        tests = _read_fd(tests_fd)  # only now: the worker's memory holds no test
        return _judge.Judge(sandbox, worker, limits).run(tests)
    os.close(tests_fd)
    runs = []
    for stdin in spec["stdins"]:
        worker = Worker(sandbox, stdin.encode(), serve=False, fresh=False)
        worker.wait(worker.started + limits["wall_seconds"])
        runs.append(worker.report())
    return {"runs": runs}


def main() -> int:
    spec_fd, tests_fd, report_fd = (int(arg) for arg in sys.argv[1:4])
    _confine.make_undumpable()
    spec = _read_fd(spec_fd)
    sys.path.extend(spec["site_packages"])  # started with -S: no .pth processing, only the paths
    try:
        report = run(spec, tests_fd)
    except SetupFailed as error:
        report = {"setup_failed": str(error)}
    with os.fdopen(report_fd, "wb") as handle:
        handle.write(json.dumps(report).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
