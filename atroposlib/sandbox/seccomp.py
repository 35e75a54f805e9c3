"""The seccomp filter of the worker, compiled once per process with libseccomp (pyseccomp).

The supervisor only loads the compiled BPF (``prctl(PR_SET_SECCOMP)``), so it needs neither
libseccomp nor its import time. Denied calls fail with EPERM; ``clone3`` reports ENOSYS so the C
library falls back to ``clone``, whose namespace flags the filter can see and refuse.
"""

from __future__ import annotations

import errno
import functools
import logging
import tempfile

logger = logging.getLogger(__name__)

DENIED_SYSCALLS = (
    # network and host sockets (AF_UNIX included; socketpair stays for pipes between threads)
    "socket", "io_uring_setup", "io_uring_enter", "io_uring_register",
    # other processes' memory and descriptors
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    # namespaces, mounts, kernel state
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount",
    "fsopen", "fsmount", "fspick", "mount_setattr", "bpf", "perf_event_open", "userfaultfd",
    "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load", "init_module",
    "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct", "quotactl", "syslog",
    "open_by_handle_at", "name_to_handle_at", "iopl", "ioperm", "settimeofday", "clock_settime",
    "adjtimex", "clock_adjtime", "vhangup",
)  # fmt: skip
NAMESPACE_FLAGS = (0x00020000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000,
                   0x02000000)  # fmt: skip


@functools.cache
def compiled_filter() -> bytes:
    """The filter as raw BPF, or ``b""`` where libseccomp (pyseccomp) is not available."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError) as error:  # OSError: libseccomp.so missing
        logger.warning("seccomp unavailable (%s): the sandbox runs without a syscall filter", error)
        return b""
    denied = seccomp.ERRNO(errno.EPERM)
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            rules.add_rule(denied, name)
        except (OSError, ValueError, RuntimeError):  # unknown to this libseccomp / arch
            logger.debug("seccomp: %s unknown here, not filtered", name)
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    for flag in NAMESPACE_FLAGS:
        rules.add_rule(denied, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    with tempfile.TemporaryFile() as handle:
        rules.export_bpf(handle)
        handle.seek(0)
        return handle.read()
