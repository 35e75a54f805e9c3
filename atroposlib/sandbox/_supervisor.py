"""Runs inside the sandbox: sets up isolation, then runs the model's program in a child.

Started by :mod:`atroposlib.sandbox.runner` as ``python -I _supervisor.py SPEC`` (standard library
only, no atroposlib import). When the runner wraps it in ``unshare`` this process is PID 1 of fresh
user, network, PID and mount namespaces: it makes every mount read-only except the working
directory, then forks the child that drops every capability, applies the resource limits and runs
the code. When PID 1 exits the kernel kills whatever the program left behind.

Exit codes read by the runner: 0 ok, 1 runtime error, 2 syntax error, 3 memory error,
64 + N the program was killed by signal N, 70 the sandbox itself could not start.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
import traceback
from typing import Any

EXIT_OK, EXIT_RUNTIME, EXIT_SYNTAX, EXIT_MEMORY, EXIT_SIGNAL_BASE, EXIT_SETUP = 0, 1, 2, 3, 64, 70
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 2, 4, 4096, 0x4000, 1 << 18
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 1
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
_BLOCKED_EVENTS = ("socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo",
                   "socket.gethostbyname", "subprocess.Popen", "os.system", "os.exec",
                   "os.posix_spawn", "os.spawn", "pty.spawn", "os.fork", "os.forkpty")  # fmt: skip


class _MountAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("attr_set", "attr_clr", "propagation", "userns")]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _set_readonly(path: str, readonly: bool) -> None:
    attr = _MountAttr(_MOUNT_ATTR_RDONLY if readonly else 0, 0 if readonly else _MOUNT_ATTR_RDONLY)
    flags = _AT_RECURSIVE
    ret = _libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, path.encode(), flags,
                        ctypes.byref(attr), ctypes.sizeof(attr))  # fmt: skip
    _check(ret, f"mount_setattr {path}")


def _kept_paths(workdir: str) -> list[str]:
    """What the program needs under a hidden directory: Python itself and its working dir."""
    candidates = [sys.base_prefix, sys.prefix, sys.exec_prefix, *sys.path, workdir,
                  os.path.dirname(os.path.realpath(sys.executable))]  # fmt: skip
    paths = sorted({os.path.realpath(p) for p in candidates if p and os.path.exists(p)}, key=len)
    kept: list[str] = []
    for path in paths:
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def _hide(hidden: list[str], kept: list[str]) -> None:
    """Cover each hidden directory (home, /tmp...) with an empty tmpfs; bind kept paths back."""
    for directory in sorted({os.path.realpath(d) for d in hidden}, key=len):
        inside = [p for p in kept if p.startswith(directory.rstrip("/") + "/")]
        if not os.path.isdir(directory) or directory in kept or directory == "/":
            continue
        handles = [(path, os.open(path, os.O_PATH)) for path in inside]
        flags = _MS_NOSUID | _MS_NODEV
        ret = _libc.mount(b"tmpfs", directory.encode(), b"tmpfs", flags, b"size=64k,mode=0755")
        _check(ret, f"hide {directory}")
        for path, fd in handles:
            os.makedirs(path, exist_ok=True)
            source = f"/proc/self/fd/{fd}".encode()
            _check(
                _libc.mount(source, path.encode(), None, _MS_BIND | _MS_REC, None), f"keep {path}"
            )
            os.close(fd)


def _isolate_filesystem(workdir: str, hidden: list[str]) -> None:
    """Everything read-only except ``workdir``; ``hidden`` directories look empty (but for the
    Python installation); /proc shows only this PID namespace."""
    _check(_libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
    # A masked host /proc refuses a fresh proc mount; the host one then stays (read-only).
    _libc.mount(b"proc", b"/proc", b"proc", 0, None)
    _hide(hidden, _kept_paths(workdir))
    _check(_libc.mount(workdir.encode(), workdir.encode(), None, _MS_BIND, None), "bind workdir")
    _set_readonly("/", True)
    _set_readonly(workdir, False)


def _drop_capabilities() -> None:
    for cap in range(64):
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _apply_limits(limits: dict[str, Any]) -> None:
    cpu = max(1, int(limits["cpu_seconds"] + 0.999))
    memory = int(limits["memory_mb"]) * 1024 * 1024
    file_size = int(limits["file_size_mb"]) * 1024 * 1024
    for which, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (memory, memory)),
        (resource.RLIMIT_FSIZE, (file_size, file_size)),
        (resource.RLIMIT_NPROC, (limits["max_processes"], limits["max_processes"])),
        (resource.RLIMIT_NOFILE, (limits["max_open_files"], limits["max_open_files"])),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(which, value)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized writes raise OSError instead


def _block_network_and_exec() -> None:
    """Fallback without namespaces: an audit hook refuses sockets, forks and new programs.

    Forks are refused because RLIMIT_NPROC does not bind root, so it cannot stop a fork bomb.
    """

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in _BLOCKED_EVENTS or (event == "socket.__new__" and args[1] != 1):
            raise PermissionError(f"blocked by the sandbox: {event}")

    sys.addaudithook(hook)


def _run_child(spec: dict[str, Any], program: Any, tests: list[Any]) -> int:
    os.chdir(spec["workdir"])
    if spec["namespaces"]:
        _drop_capabilities()
    _apply_limits(spec["limits"])
    if not spec["namespaces"]:
        _block_network_and_exec()
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(program, namespace)
    except MemoryError as error:
        _print_user_traceback(error)
        return EXIT_MEMORY
    except SystemExit as stop:
        if stop.code not in (None, 0):
            return EXIT_RUNTIME
    except BaseException as error:
        _print_user_traceback(error)
        return EXIT_RUNTIME
    if not tests:
        return EXIT_OK
    outcomes = []
    for test in tests:
        signal.setitimer(signal.ITIMER_REAL, spec["test_seconds"])
        try:
            exec(test, namespace)
            outcomes.append(True)
        except BaseException:
            outcomes.append(False)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    report = json.dumps({"nonce": spec["nonce"], "passed": outcomes}).encode()
    os.write(spec["report_fd"], report)
    return EXIT_OK


def _print_user_traceback(error: BaseException) -> None:
    """The traceback from the program's own frames (this supervisor's frame left out)."""
    tb = error.__traceback__.tb_next if error.__traceback__ else None
    traceback.print_exception(type(error), error, tb)


def _on_alarm(signum: int, frame: Any) -> None:
    raise TimeoutError("test took longer than its time limit")


def main() -> int:
    spec_path = sys.argv[1]
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    os.unlink(spec_path)  # the nonce now lives only in this process's memory
    try:
        program = compile(spec["code"], "solution.py", "exec")
        tests = [compile(t, f"test_{i}.py", "exec") for i, t in enumerate(spec["tests"])]
    except (SyntaxError, ValueError):
        traceback.print_exc(limit=0)
        return EXIT_SYNTAX
    try:
        if spec["namespaces"]:
            _isolate_filesystem(spec["workdir"], spec["hidden"])
    except OSError as error:
        sys.stderr.write(f"sandbox setup failed: {error}\n")
        return EXIT_SETUP
    signal.signal(signal.SIGALRM, _on_alarm)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = EXIT_SETUP
        try:
            code = _run_child(spec, program, tests)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    if spec["report_fd"] is not None:
        os.close(spec["report_fd"])
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return EXIT_SIGNAL_BASE + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main())
