"""A sandbox for model-written Python: separate process, resource limits, no network."""

from atroposlib.sandbox.models import Isolation, SandboxLimits, SandboxResult, SandboxStatus
from atroposlib.sandbox.runner import arun_python, detect_isolation, run_python

__all__ = [
    "Isolation",
    "SandboxLimits",
    "SandboxResult",
    "SandboxStatus",
    "arun_python",
    "detect_isolation",
    "run_python",
]
