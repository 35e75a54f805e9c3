"""Hostile probe programs that show each limit holding on this host (``atropos-sandbox-check``)."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from atroposlib.sandbox.models import SandboxLimits, SandboxResult, SandboxStatus
from atroposlib.sandbox.runner import run_python

LIMITS = SandboxLimits(cpu_seconds=1, wall_seconds=4, memory_mb=128, max_processes=8, disk_mb=4)

FORKS = """
import os, time
n = 0
try:
    while n < 64:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
except OSError:
    pass
print(n)
"""
TOGETHER = """
import os, time
for _ in range(4):
    if os.fork() == 0:
        block = bytearray(100 * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(3)
        os._exit(0)
time.sleep(3)
print("survived")
"""
DISK = """
written = 0
try:
    for i in range(64):
        with open(f"f{i}", "wb") as handle:
            handle.write(b"x" * 2**20)
        written += 1
except OSError:
    pass
print(written)
"""
CONNECT = """
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=1)
    print("connected")
except OSError as error:
    print(type(error).__name__)
"""
ENVIRON = """
for path in ("/proc/1/environ", "/proc/self/environ"):
    try:
        data = open(path, "rb").read()
        print("SECRET" if b"ATROPOS" in data else "read")
    except OSError:
        print("denied")
"""


@dataclass
class LimitProof:
    limit: str
    attempt: str
    observed: str
    held: bool


def _run(code: str) -> SandboxResult:
    return run_python(code, limits=LIMITS)


def prove_limits() -> list[LimitProof]:
    """Run each hostile probe in the sandbox and say what happened."""
    forks, big, together = _run(FORKS), _run("x = bytearray(10 * 2**30)"), _run(TOGETHER)
    disk, spin, environ = _run(DISK), _run("while True:\n    pass"), _run(ENVIRON)
    with socket.create_server(("127.0.0.1", 0)) as server:
        net = _run(CONNECT.format(port=server.getsockname()[1]))
    count, written = forks.stdout.strip(), disk.stdout.strip()
    limit = LIMITS.max_processes
    return [
        LimitProof("processes", f"fork 64 (limit {limit} with itself)", f"{count} forks",
                   count.isdigit() and int(count) < limit),
        LimitProof("memory, one process", "allocate 10 GiB", big.status.value,
                   big.status is SandboxStatus.MEMORY),
        LimitProof("memory, all processes", f"4 x 100 MiB (limit {LIMITS.memory_mb})",
                   together.status.value, together.status is SandboxStatus.MEMORY),
        LimitProof("disk written", f"64 files x 1 MiB (limit {LIMITS.disk_mb})",
                   f"{written} MiB written", written.isdigit() and int(written) <= LIMITS.disk_mb),
        LimitProof("cpu / wall time", "infinite loop", spin.status.value,
                   spin.status is SandboxStatus.TIMEOUT),
        LimitProof("network", "connect to a listener on the host's loopback",
                   net.stdout.strip() or net.status.value, "connected" not in net.stdout),
        LimitProof("host processes", "read /proc/1/environ and its own",
                   " / ".join(environ.stdout.split()), "SECRET" not in environ.stdout),
    ]  # fmt: skip
