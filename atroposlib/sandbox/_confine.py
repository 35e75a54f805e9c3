"""Kernel mechanisms that confine the worker: namespaces, filesystem, identity, limits, seccomp.

Standard library only (ctypes); used by the supervisor and its forked children, never by the
model's code. The order matters and is the supervisor's: unshare -> id maps (written by the
parent) -> become the namespace's root -> filesystem -> fork PID 1 -> /proc -> drop everything.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
from typing import Any

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 0x4000, 1 << 18
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 1
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 1, 4, 22, 2
_BLOCKED_EVENTS = ("socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo",
                   "socket.gethostbyname", "subprocess.Popen", "os.system", "os.exec",
                   "os.posix_spawn", "os.spawn", "pty.spawn", "os.kill", "os.killpg")  # fmt: skip
_FORK_EVENTS = ("os.fork", "os.forkpty")
SANDBOX_PROCESSES = 2  # the supervisor's child C and the namespace's init share the program's uid


class _MountAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("attr_set", "attr_clr", "propagation", "userns")]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


# ---- namespaces and identity ------------------------------------------------------------


def unshare_namespaces() -> None:
    """New user, mount, PID, network, IPC and UTS namespaces (the PID one for children)."""
    if os.geteuid() == 0:
        os.setgroups([])  # root's supplementary groups would still open group-owned files
    _check(_libc.unshare(NAMESPACES), "unshare")


def write_id_maps(pid: int, host_id: int) -> None:
    """Map the namespace's root of ``pid`` to ``host_id`` (the parent's side of unshare)."""
    with open(f"/proc/{pid}/setgroups", "w") as handle:
        handle.write("deny")
    for kind in ("uid", "gid"):
        with open(f"/proc/{pid}/{kind}_map", "w") as handle:
            handle.write(f"0 {host_id} 1\n")


def become_namespace_root() -> None:
    """Take the mapped identity: from here the host sees ``host_id``, never root."""
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)


def become(host_id: int) -> None:
    """Without namespaces, as root: switch to an unprivileged uid/gid of its own."""
    os.setgroups([])
    os.setresgid(host_id, host_id, host_id)
    os.setresuid(host_id, host_id, host_id)


def make_undumpable() -> None:
    """No ptrace, /proc/PID/mem or environ of this process for anyone without CAP_SYS_PTRACE."""
    _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (the chain supervisor -> C -> W)."""
    parent = os.getppid()
    _check(_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    if os.getppid() != parent:
        os._exit(70)


def drop_capabilities() -> None:
    for cap in range(64):
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


# ---- filesystem ------------------------------------------------------------------------


def _set_readonly(path: str, readonly: bool) -> None:
    attr = _MountAttr(_MOUNT_ATTR_RDONLY if readonly else 0, 0 if readonly else _MOUNT_ATTR_RDONLY)
    ret = _libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, path.encode(), _AT_RECURSIVE,
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


def open_kept(workdir: str) -> list[tuple[str, int]]:
    """Handles on what stays visible under hidden directories, opened while this process still
    has the host's identity (an unprivileged uid could not reach e.g. /root/.pyenv)."""
    return [(path, os.open(path, os.O_PATH)) for path in _kept_paths(workdir)]


def _hide(hidden: list[str], kept: list[tuple[str, int]]) -> None:
    """Cover each hidden directory (home, /tmp...) with an empty tmpfs; bind kept paths back."""
    kept_paths = [path for path, _ in kept]
    for directory in sorted({os.path.realpath(d) for d in hidden}, key=len):
        if not os.path.isdir(directory) or directory in kept_paths or directory == "/":
            continue
        inside = [(p, fd) for p, fd in kept if p.startswith(directory.rstrip("/") + "/")]
        flags = _MS_NOSUID | _MS_NODEV
        ret = _libc.mount(b"tmpfs", directory.encode(), b"tmpfs", flags, b"size=64k,mode=0755")
        _check(ret, f"hide {directory}")
        for path, fd in inside:
            os.makedirs(path, exist_ok=True)
            source = f"/proc/self/fd/{fd}".encode()
            _check(
                _libc.mount(source, path.encode(), None, _MS_BIND | _MS_REC, None), f"keep {path}"
            )


def isolate_filesystem(
    workdir: str, hidden: list[str], kept: list[tuple[str, int]], disk_mb: int, max_files: int
) -> None:
    """Everything read-only; ``hidden`` directories look empty (but for ``kept``, the Python
    installation); ``workdir`` becomes a fresh tmpfs of ``disk_mb`` MiB and ``max_files`` inodes,
    the only place the program can write (so the total it writes is bounded, not each file)."""
    _check(_libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
    _hide(hidden, kept)
    for _, fd in kept:
        os.close(fd)
    os.makedirs(workdir, exist_ok=True)  # in the hidden (empty) /tmp of this namespace
    options = f"size={disk_mb}m,nr_inodes={max_files},mode=0700".encode()
    flags = _MS_NOSUID | _MS_NODEV
    _check(_libc.mount(b"tmpfs", workdir.encode(), b"tmpfs", flags, options), "workdir tmpfs")
    _set_readonly("/", True)
    _set_readonly(workdir, False)


def mount_proc() -> bool:
    """A /proc that shows only this PID namespace (run as its PID 1). False where the host's
    /proc is masked (containers) and refuses it: the host /proc then stays, read-only."""
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    return _libc.mount(b"proc", b"/proc", b"proc", flags, None) == 0


# ---- limits and system calls ----------------------------------------------------------------


def apply_limits(limits: dict[str, Any]) -> None:
    cpu = max(1, int(limits["cpu_seconds"] + 0.999))
    memory = int(limits["memory_mb"]) * 1024 * 1024
    file_size = int(limits["file_size_mb"]) * 1024 * 1024
    nproc = int(limits["max_processes"]) + SANDBOX_PROCESSES  # its uid also runs C and init
    for which, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (memory, memory)),
        (resource.RLIMIT_FSIZE, (file_size, file_size)),
        (resource.RLIMIT_NPROC, (nproc, nproc)),
        (resource.RLIMIT_NOFILE, (limits["max_open_files"], limits["max_open_files"])),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(which, value)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized writes raise OSError instead


def load_seccomp(bpf: bytes) -> None:
    """Install a compiled seccomp filter (raw ``struct sock_filter`` array) on this process."""
    buffer = ctypes.create_string_buffer(bpf, len(bpf))
    program = _SockFprog(len(bpf) // 8, ctypes.addressof(buffer))
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(_libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0),
           "seccomp")  # fmt: skip


def block_with_audit_hook() -> None:
    """Fallback without namespaces: refuse sockets, new programs, signals and forks in Python
    code (native code can get around it); without a PID namespace a fork could outlive the run,
    and RLIMIT_NPROC would count the env's own processes when the uid is the env's."""
    blocked = _BLOCKED_EVENTS + _FORK_EVENTS

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in blocked or (event == "socket.__new__" and args[1] != 1):
            raise PermissionError(f"blocked by the sandbox: {event}")

    sys.addaudithook(hook)
