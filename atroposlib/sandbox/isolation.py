"""Which isolation this host gives the sandbox, checked from inside a sandboxed probe."""

from __future__ import annotations

import functools
import json
import logging
import os

from pydantic import BaseModel, Field

from atroposlib.errors import ConfigError, SandboxError
from atroposlib.sandbox.models import Isolation, SandboxLimits, SandboxStatus
from atroposlib.sandbox.runner import detect_isolation, run_python

logger = logging.getLogger(__name__)

PROBE = r"""
import json, os, resource, socket
def attempt(action):
    try:
        action()
        return "allowed"
    except OSError as error:
        return type(error).__name__ + ": " + (error.strerror or str(error))
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines()
              if ":\t" in line)
uid_map = open("/proc/self/uid_map").read().split()
host_uid = int(uid_map[1]) if len(uid_map) == 3 and uid_map[0] == "0" else os.getuid()
print(json.dumps({
    "host_uid": host_uid,
    "capabilities": status.get("CapEff", "").strip(),
    "seccomp": status.get("Seccomp", "0").strip(),
    "no_new_privs": status.get("NoNewPrivs", "0").strip(),
    "visible_processes": sum(name.isdigit() for name in os.listdir("/proc")),
    "socket": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()),
    "unix_socket": attempt(lambda: socket.socket(socket.AF_UNIX).close()),
    "write_outside": attempt(lambda: open("/etc/.atropos-sandbox-probe", "w").close()),
    "network_interfaces": sorted(line.split(":")[0].strip()
                                 for line in open("/proc/net/dev").read().splitlines()[2:]),
    "rlimits": {name: resource.getrlimit(getattr(resource, name))[0]
                for name in ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_NOFILE",
                             "RLIMIT_FSIZE")},
}))
"""


class IsolationReport(BaseModel):
    """What the sandbox enforces on this host, as a probe inside it saw it."""

    isolation: Isolation
    mechanisms: dict[str, str] = Field(description="Mechanism -> what it does here.")
    limits: dict[str, str] = Field(description="Limit -> what enforces it.")
    weaknesses: list[str] = Field(description="What a hostile program could still do.")

    @property
    def weak(self) -> bool:
        return bool(self.weaknesses)


@functools.cache
def isolation_report() -> IsolationReport:
    """Run the probe in the sandbox this host gives and describe what it found."""
    isolation = detect_isolation()
    probe = run_python(PROBE, limits=SandboxLimits(max_processes=8), isolation=isolation)
    if probe.status is not SandboxStatus.OK:
        raise SandboxError(f"the isolation probe failed ({probe.status}): {probe.stderr_tail}")
    seen = json.loads(probe.stdout)
    return IsolationReport(
        isolation=isolation,
        mechanisms=_mechanisms(isolation, seen),
        limits=_limits(isolation, seen),
        weaknesses=_weaknesses(isolation, seen),
    )


def _mechanisms(isolation: Isolation, seen: dict) -> dict[str, str]:
    spaced = isolation is Isolation.NAMESPACES
    no = "not active (no namespaces)"
    return {
        "user namespace": f"root inside = host uid {seen['host_uid']}" if spaced else no,
        "pid namespace": f"{seen['visible_processes']} process(es) visible" if spaced else no,
        "network namespace": f"interfaces {seen['network_interfaces']}" if spaced else no,
        "mount namespace": "read-only /, tmpfs work folder, homes and /tmp hidden"
        if spaced
        else no,
        "identity": f"host uid {seen['host_uid']}"
        + (" (unprivileged)" if seen["host_uid"] else " (ROOT)"),
        "capabilities": "none" if int(seen["capabilities"] or "0", 16) == 0 else "SOME KEPT",
        "seccomp": "filter active (no sockets, ptrace, io_uring, namespaces, mounts)"
        if seen["seccomp"] == "2"
        else "not active",
        "no_new_privs": "set" if seen["no_new_privs"] == "1" else "not set",
        "audit hook": "not needed" if spaced else "active (Python-level only)",
        "cgroups": _cgroup_state(),
    }


def _cgroup_state() -> str:
    """Whether a cgroup v2 hierarchy with memory and pids controllers is delegated here."""
    mounts = [line.split(" - ")[0].split()[4] for line in _mountinfo() if " - cgroup2 " in line]
    for mount in mounts:
        try:
            with open(os.path.join(mount, "cgroup.controllers")) as handle:
                controllers = set(handle.read().split())
        except OSError:
            continue
        if {"memory", "pids"} <= controllers and os.access(mount, os.W_OK):
            return f"v2 writable at {mount}, not used: the supervisor watches memory via /proc"
        return f"v2 at {mount} without memory/pids controllers: not usable"
    return "no cgroup v2 hierarchy: total memory watched through /proc"


def _mountinfo() -> list[str]:
    with open("/proc/self/mountinfo") as handle:
        return handle.read().splitlines()


def _limits(isolation: Isolation, seen: dict) -> dict[str, str]:
    nproc = "RLIMIT_NPROC (binds: unprivileged uid)" if seen["host_uid"] else "fork blocked"
    spaced = isolation is Isolation.NAMESPACES
    return {
        "cpu time": "RLIMIT_CPU per process",
        "wall time": "supervisor kills the whole process tree",
        "memory": "RLIMIT_AS per process + the tree's resident memory (supervisor)"
        if spaced
        else "RLIMIT_AS per process",
        "processes": nproc if spaced else "fork blocked by the audit hook",
        "disk written": "tmpfs size of the work folder (all files)"
        if spaced
        else "RLIMIT_FSIZE per file only",
        "open files": "RLIMIT_NOFILE",
        "output": "supervisor cuts stdout/stderr at their caps",
    }


def _weaknesses(isolation: Isolation, seen: dict) -> list[str]:
    weak = []
    if isolation is not Isolation.NAMESPACES:
        weak.append(
            "no namespaces: host files are protected only by their permissions, the work "
            "folder has only a per-file size limit, and the audit hook that refuses sockets, "
            "forks and signals can be bypassed by native code (ctypes)"
        )
    if seen["host_uid"] == 0:
        weak.append("the program runs as root on the host")
    elif isolation is not Isolation.NAMESPACES and seen["host_uid"] == os.geteuid():
        weak.append("the program runs as the env's own uid and could signal or read its files")
    if seen["seccomp"] != "2":
        weak.append(
            "no seccomp filter (libseccomp / pyseccomp missing): host unix sockets and ptrace "
            "are reachable where the namespaces do not cover them"
        )
    if seen["socket"] == "allowed" and isolation is not Isolation.NAMESPACES:
        weak.append("native code can open network sockets")
    return weak


def check_isolation(limits: SandboxLimits, *, serving: bool, env_name: str) -> IsolationReport:
    """Log the sandbox's weaknesses (every start); refuse ``serve`` on weak isolation unless
    ``limits.allow_weak_isolation``."""
    report = isolation_report()
    for weakness in report.weaknesses:
        logger.warning("%s: code sandbox isolation is weak here: %s", env_name, weakness)
    if report.weak and serving and not limits.allow_weak_isolation:
        raise ConfigError(
            f"{env_name}: the code sandbox has only weak isolation on this host "
            f"({'; '.join(report.weaknesses)}), so a policy could game its reward or harm the "
            "host; run where user namespaces are allowed (atropos-sandbox-check shows what is "
            "missing) or pass --env.sandbox.allow_weak_isolation to accept the risk"
        )
    return report
