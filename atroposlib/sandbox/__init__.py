"""A sandbox for model-written Python: confined worker processes, limits that hold as root, and
test verdicts decided by a trusted supervisor outside the program's process."""

from atroposlib.sandbox.isolation import IsolationReport, check_isolation, isolation_report
from atroposlib.sandbox.models import Isolation, SandboxLimits, SandboxResult, SandboxStatus
from atroposlib.sandbox.runner import (
    arun_io,
    arun_python,
    detect_isolation,
    forget_isolation,
    run_io,
    run_python,
)

__all__ = [
    "Isolation",
    "IsolationReport",
    "SandboxLimits",
    "SandboxResult",
    "SandboxStatus",
    "arun_io",
    "arun_python",
    "check_isolation",
    "detect_isolation",
    "forget_isolation",
    "isolation_report",
    "run_io",
    "run_python",
]
