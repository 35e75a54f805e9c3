"""What code environments share: the isolation check at start and failed sandbox runs."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Iterable
from typing import Protocol, TypeVar

from atroposlib.errors import SandboxError
from atroposlib.sandbox.isolation import check_isolation
from atroposlib.sandbox.models import SandboxLimits

logger = logging.getLogger(__name__)
T = TypeVar("T")
SANDBOX_FAILURE = "sandbox_failure"


class _Perf(Protocol):
    rejected: Counter[str]


class _CodeEnv(Protocol):
    name: str | None
    serving: bool
    perf: _Perf


def check_env_sandbox(env: _CodeEnv, limits: SandboxLimits) -> None:
    """At every start: log the sandbox's weaknesses; ``serve`` refuses weak isolation unless
    ``--env.sandbox.allow_weak_isolation`` (raises ConfigError naming the fix)."""
    check_isolation(limits, serving=env.serving, env_name=env.name or type(env).__name__)


async def gather_runs(env: _CodeEnv, runs: Iterable[Awaitable[T]]) -> list[T]:
    """Await a group's sandbox runs. When the sandbox itself fails (cannot start, killed by
    the host, disk full) the whole group fails: the error propagates (the env logs it and sends
    nothing) and ``perf/groups_rejected/sandbox_failure`` counts it; it never becomes a score."""
    try:
        return list(await asyncio.gather(*runs))
    except SandboxError:
        env.perf.rejected[SANDBOX_FAILURE] += 1
        raise
