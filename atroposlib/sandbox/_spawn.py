"""Forks the confined worker of the supervisor: ``C`` enters the namespaces and builds the
filesystem, its child is the namespace's init (PID 1), whose child ``W`` takes the identity, the
limits and the seccomp filter and runs the program. Standard library only, like the supervisor.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys
from typing import Any

import _confine
import _wire
import _worker

EXIT_SIGNAL_BASE, EXIT_SETUP = 64, 70
_WORKER_FDS = ("stdin", "stdout", "stderr", "request", "response", "source", "ready")
_SOURCE_FD = _WORKER_FDS.index("source")


class SetupFailed(Exception):
    """The sandbox could not be built (not the program's doing)."""


class Sandbox:
    """Starts confined workers as the spec says (namespaces, or the audit-hook fallback)."""

    def __init__(self, spec: dict[str, Any], program: Any) -> None:
        self.spec, self.program = spec, program
        self.limits: dict[str, Any] = spec["limits"]
        self.namespaces: bool = spec["namespaces"]
        self.host_id: int | None = spec["host_id"]
        # The real file, resolved while the host's filesystem is in view: a virtualenv's bin/
        # may lie in a hidden directory (a home, /tmp) where only its target stays visible.
        self.interpreter = os.path.realpath(sys.executable)

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
        problem = b"".join(line for line in lines if line.startswith(b"sandbox setup failed"))
        if b"started\n" not in lines or not pids or problem:
            raise SetupFailed(
                problem.decode(errors="replace").strip() or "the worker did not start"
            )
        return pids[0]

    def _child(self, keep: dict[str, int], mapped_r: int, ready_w: int, serve: bool) -> None:
        """``C``: enter the namespaces, build the filesystem, fork the worker, relay its end."""
        code = EXIT_SETUP
        try:
            os.setpgid(0, 0)  # a group of its own, for the fallback's kill
            _close_all_but({*keep.values(), mapped_r, ready_w})  # the tests' and report's too
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
            _report_failure(ready_w, f"sandbox setup failed: {error}")
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
            _report_failure(keep["ready"], f"sandbox setup failed in init: {error}")
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
            if not self.namespaces and keep["source"] < 0:
                _confine.block_with_audit_hook()  # a fresh interpreter sets its own after the exec
            os.write(ready, b"started\n")
            if keep["source"] >= 0:
                os.set_inheritable(ready, False)  # closed by the exec; a failed exec reports
                script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker.py")
                flags = ("-s", "-S", "-P")
                os.execv(self.interpreter, [self.interpreter, *flags, script, str(_SOURCE_FD)])
            os.close(ready)
        except BaseException as error:
            _report_failure(ready, f"sandbox setup failed in the worker: {error}")
            os._exit(EXIT_SETUP)
        code = _worker.EXIT_RUNTIME
        try:
            code = _worker.run(self.program, serve)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def kill_every_process_of(host_id: int) -> None:
    """As root without namespaces: a helper takes the run's uid and kills all it can signal."""
    helper = os.fork()
    if helper == 0:
        try:
            _confine.become(host_id)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(helper, 0)


def _report_failure(ready: int, message: str) -> None:
    """Tell the supervisor why the sandbox could not start; never raise (this is a forked copy
    of the supervisor: an exception here would run the supervisor's own code in the child)."""
    with contextlib.suppress(OSError):
        os.write(ready, f"{message}\n".encode())


def _close_all_but(kept: set[int]) -> None:
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd > 2 and fd not in kept:
            with contextlib.suppress(OSError):
                os.close(fd)


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
    source = {"code": spec["code"], "serve": serve, "site_packages": spec["site_packages"],
              "audit_hook": not spec["namespaces"]}  # fmt: skip
    os.write(fd, _wire.dumps(source))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
