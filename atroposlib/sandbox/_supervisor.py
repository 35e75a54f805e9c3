"""The trusted supervisor of one sandboxed run: starts confined workers, drains their output,
enforces the limits the kernel does not, and (with tests) judges them. Model code never runs here.

Started by :mod:`atroposlib.sandbox.runner` as ``python -s -S -P _supervisor.py SPEC_FD TESTS_FD
REPORT_FD`` (standard library only, no atroposlib import). Each worker is a child ``C`` that enters
fresh user/mount/PID/network/IPC/UTS namespaces, whose root this process maps to an unprivileged
host uid; ``C`` forks the worker ``W`` (PID 1 of the new PID namespace, so every process the program
starts dies with it), which mounts its own /proc, drops every capability, takes the rlimits and
the seccomp filter, and runs the program. The verdict travels only through ``REPORT_FD``, which no
worker holds; the tests are read from ``TESTS_FD`` only after the first worker was forked.
"""

from __future__ import annotations

import fcntl
import json
import os
import selectors
import signal
import sys
import time
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -P leaves the script's folder out
import contextlib

import _confine
import _judge
import _wire
import _worker

EXIT_SIGNAL_BASE, EXIT_SETUP = 64, 70
_STATUS_BY_EXIT = {0: "ok", 1: "runtime_error", 3: "memory"}
_PAGE = os.sysconf("SC_PAGE_SIZE")
_WATCH_INTERVAL_S = 0.05
_WORKER_FDS = ("stdin", "stdout", "stderr", "request", "response", "source", "ready")
_SOURCE_FD = _WORKER_FDS.index("source")


class SetupFailed(Exception):
    """The sandbox could not be built (not the program's doing)."""


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
                    _kill_every_process_of(self.host_id)
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


class Sandbox:
    """Starts confined workers as the spec says (namespaces, or the audit-hook fallback)."""

    def __init__(self, spec: dict[str, Any], program: Any) -> None:
        self.spec, self.program = spec, program
        self.limits: dict[str, Any] = spec["limits"]
        self.namespaces: bool = spec["namespaces"]
        self.host_id: int | None = spec["host_id"]

    def spawn(self, stdin: bytes, serve: bool, fresh: bool) -> tuple[int, int, tuple[int, ...]]:
        """Fork the worker; return (child pid, worker's host pid, the supervisor's fds)."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        req_r, req_w = os.pipe() if serve else (-1, -1)
        resp_r, resp_w = os.pipe() if serve else (-1, -1)
        mapped_r, mapped_w = os.pipe()
        ready_r, ready_w = os.pipe()
        stdin_fd = os.memfd_create("stdin")
        os.write(stdin_fd, stdin)
        os.lseek(stdin_fd, 0, os.SEEK_SET)
        source_fd = _source_fd(self.spec, serve) if fresh else -1
        sys.stdout.flush()
        child = os.fork()
        if child == 0:
            keep = {"stdin": stdin_fd, "stdout": out_w, "stderr": err_w, "request": req_r,
                    "response": resp_w, "source": source_fd}  # fmt: skip
            self._child(keep, mapped_r, ready_w, serve)
        for fd in (out_w, err_w, req_r, resp_w, mapped_r, ready_w, stdin_fd, source_fd):
            if fd >= 0:
                os.close(fd)
        try:
            init_pid = self._handshake(child, mapped_w, ready_r)
        except BaseException:
            for fd in (out_r, err_r, req_w, resp_r):
                if fd >= 0:
                    os.close(fd)
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            raise
        return child, init_pid, (out_r, err_r, req_w, resp_r)

    def _handshake(self, child: int, mapped_w: int, ready_r: int) -> int:
        """Map the namespace's ids when ``C`` has unshared; wait for ``W``'s pid and start."""
        lines: list[bytes] = []
        with os.fdopen(ready_r, "rb") as ready, os.fdopen(mapped_w, "wb", buffering=0) as mapped:
            if self.namespaces:
                line = ready.readline()
                if line != b"unshared\n":
                    raise SetupFailed(line.decode(errors="replace").strip() or "no answer")
                _confine.write_id_maps(child, self.host_id if self.host_id else os.geteuid())
                mapped.write(b"m")
            lines = ready.readlines()
        pids = [int(line.split()[1]) for line in lines if line.startswith(b"pid ")]
        if b"started\n" not in lines or not pids:
            problem = b"".join(line for line in lines if line.startswith(b"sandbox setup failed"))
            raise SetupFailed(
                problem.decode(errors="replace").strip() or "the worker did not start"
            )
        return pids[0]

    def _child(self, keep: dict[str, int], mapped_r: int, ready_w: int, serve: bool) -> None:
        """``C``: enter the namespaces, build the filesystem, fork the worker, relay its end."""
        code = EXIT_SETUP
        try:
            os.setpgid(0, 0)  # a group of its own, for the fallback's kill
            if self.namespaces:
                _confine.unshare_namespaces()
                os.write(ready_w, b"unshared\n")
                if os.read(mapped_r, 1) != b"m":
                    raise SetupFailed("the supervisor did not map the namespace's ids")
                kept = _confine.open_kept(self.spec["workdir"])  # while still the host's uid
                _confine.become_namespace_root()
                _confine.isolate_filesystem(
                    self.spec["workdir"],
                    self.spec["hidden"],
                    kept,
                    self.limits["disk_mb"],
                    self.limits["max_files"],
                )
            _confine.die_with_parent()
            init = os.fork()
            if init == 0:
                self._init({**keep, "ready": ready_w}, serve)
            os.write(ready_w, f"pid {init}\n".encode())
            for fd in (*keep.values(), mapped_r, ready_w):
                if fd >= 0:
                    os.close(fd)
            code = _exit_code(os.waitpid(init, 0)[1])
        except BaseException as error:
            os.write(ready_w, f"sandbox setup failed: {error}\n".encode())
        os._exit(code)

    def _init(self, keep: dict[str, int], serve: bool) -> None:
        """PID 1 of the sandbox (trusted): a /proc of its own, then the worker; reaps orphans and
        relays the worker's end. Its death kills every process in the namespace."""
        code = EXIT_SETUP
        try:
            _confine.die_with_parent()
            if self.namespaces:
                _confine.mount_proc()
            worker = os.fork()
            if worker == 0:
                self._worker(keep, serve)
            for fd in keep.values():
                if fd >= 0:
                    os.close(fd)
            while True:
                pid, status = os.wait()
                if pid == worker:
                    code = _exit_code(status)
                    break
        except BaseException as error:
            os.write(keep["ready"], f"sandbox setup failed in init: {error}\n".encode())
        os._exit(code)

    def _worker(self, keep: dict[str, int], serve: bool) -> None:
        """``W``: the confined process that runs the model's program (never returns)."""
        ready = keep["ready"]
        try:
            ready = _arrange_fds([keep[name] for name in _WORKER_FDS])
            if not self.namespaces and self.host_id:
                _confine.become(self.host_id)
            if self.namespaces:
                _confine.drop_capabilities()
            os.chdir(self.spec["workdir"])
            _confine.apply_limits(self.limits)
            if self.spec["seccomp"]:
                _confine.load_seccomp(bytes.fromhex(self.spec["seccomp"]))
            if not self.namespaces:
                _confine.block_with_audit_hook(block_fork=True)
            os.write(ready, b"started\n")
            os.close(ready)
            if keep["source"] >= 0:
                script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker.py")
                flags = ("-s", "-S", "-P")
                os.execv(sys.executable, [sys.executable, *flags, script, str(_SOURCE_FD)])
        except BaseException as error:
            os.write(ready, f"sandbox setup failed in the worker: {error}\n".encode())
            os._exit(EXIT_SETUP)
        code = _worker.EXIT_RUNTIME
        try:
            code = _worker.run(self.program, serve)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def _kill_every_process_of(host_id: int) -> None:
    """As root without namespaces: a helper takes the run's uid and kills all it can signal."""
    helper = os.fork()
    if helper == 0:
        try:
            _confine.become(host_id)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(helper, 0)


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return EXIT_SIGNAL_BASE - code if code < 0 else code


def _arrange_fds(sources: list[int]) -> int:
    """Put ``sources`` at 0, 1, 2... (absent ones closed), close every other descriptor;
    return where the last one (the start pipe) ended up."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) if fd >= 0 else -1 for fd in sources]
    for target, fd in enumerate(high):
        if fd >= 0:
            os.dup2(fd, target)
        else:
            with contextlib.suppress(OSError):
                os.close(target)
    os.closerange(len(high), 1 << 16)
    return len(high) - 1


def _source_fd(spec: dict[str, Any], serve: bool) -> int:
    fd = os.memfd_create("program")
    source = {"code": spec["code"], "serve": serve, "site_packages": spec["site_packages"]}
    os.write(fd, _wire.dumps(source))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_fd(fd: int) -> dict[str, Any]:
    with os.fdopen(fd, "rb") as handle:
        data: dict[str, Any] = json.loads(handle.read())
    return data


def run(spec: dict[str, Any], tests_fd: int) -> dict[str, Any]:
    try:
        program = compile(spec["code"], "solution.py", "exec")
    except (SyntaxError, ValueError):
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
