"""Typed limits and results of a sandboxed run."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field


class SandboxStatus(StrEnum):
    """How a sandboxed program ended."""

    OK = "ok"
    SYNTAX_ERROR = "syntax_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    MEMORY = "memory"
    OUTPUT_LIMIT = "output_limit"


class Isolation(StrEnum):
    """How the program is kept away from the host.

    ``namespaces``: fresh user, mount, PID, network, IPC and UTS namespaces whose root is an
    unprivileged host uid (so rlimits bind even when the env runs as root): no network but an
    unconfigured loopback, a read-only filesystem except a size-limited tmpfs working directory,
    home and temporary directories shown empty (but for the Python installation), a /proc of the
    sandbox's own processes, every capability dropped, a seccomp filter (no sockets, ptrace,
    io_uring, new namespaces...), and every leftover process killed with the namespace's PID 1.
    ``audit_hook``: the weak fallback where namespaces are refused: an audit hook refuses
    sockets, forks, signals and new programs in Python code (native code can get around it), the
    host's file permissions protect files (as root, an unprivileged uid of its own) and the
    working directory has only a per-file size limit. ``atropos-sandbox-check`` shows which.
    """

    NAMESPACES = "namespaces"
    AUDIT_HOOK = "audit_hook"


class SandboxLimits(BaseModel):
    """Resource limits applied to the program's process (``setrlimit`` in the child)."""

    cpu_seconds: float = Field(5.0, gt=0, description="CPU time before SIGXCPU ends the program.")
    wall_seconds: float = Field(10.0, gt=0, description="Wall-clock time before it is killed.")
    memory_mb: int = Field(
        512,
        ge=64,
        description="Memory of the program, MiB: each process's address space "
        "(RLIMIT_AS) and the resident memory of all its processes together.",
    )
    file_size_mb: int = Field(16, ge=0, description="Largest file the program may write, MiB.")
    output_bytes: int = Field(
        64 * 1024, ge=1, description="stdout kept; more than this ends the run as output_limit."
    )
    stderr_tail_bytes: int = Field(4096, ge=0, description="Tail of stderr kept in the result.")
    max_processes: int = Field(
        16, ge=2, description="Processes and threads the program may have (RLIMIT_NPROC)."
    )
    max_open_files: int = Field(64, ge=16, description="Open file descriptors (RLIMIT_NOFILE).")
    test_seconds: float = Field(2.0, gt=0, description="Time limit of one test in test-case mode.")
    disk_mb: int = Field(
        64, ge=1, description="Everything the program may write, all files together, MiB."
    )
    max_files: int = Field(4096, ge=16, description="Files and folders the program may create.")
    allow_weak_isolation: bool = Field(
        False,
        description="Let code environments serve where the sandbox can only use its weak "
        "fallback (see atropos-sandbox-check); the weakness is logged at every start.",
    )


class SandboxResult(BaseModel):
    """What a sandboxed run produced."""

    status: SandboxStatus
    stdout: str = Field(description="Standard output, at most ``output_bytes``.")
    stderr_tail: str = Field(description="The last ``stderr_tail_bytes`` of standard error.")
    duration_s: float = Field(description="Wall-clock seconds from start to exit.")
    exit_code: int | None = Field(description="The supervisor's exit code; None when killed.")
    isolation: Isolation
    tests_passed: list[bool] | None = Field(
        None, description="Per-test outcomes in test-case mode; None otherwise."
    )

    @property
    def ok(self) -> bool:
        return self.status is SandboxStatus.OK

    @property
    def pass_rate(self) -> float:
        """Fraction of tests passed (0.0 when the program itself failed or had no tests)."""
        if not self.tests_passed:
            return 0.0
        return sum(self.tests_passed) / len(self.tests_passed)
