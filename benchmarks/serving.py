"""Waiting for a server a benchmark or a test started: one loop instead of one per script."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx


def wait_until_healthy(
    url: str,
    process: subprocess.Popen[bytes],
    timeout_s: float,
    log: Path | None = None,
    poll_s: float = 0.2,
    name: str | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    """Return once ``GET {url}/health`` answers 200. Raises ``RuntimeError`` (naming the
    server as ``name``, else its URL, and ``log`` when given) if ``process`` exits first or
    ``timeout_s`` passes."""
    name = name or url
    where = f"; see {log}" if log is not None else ""
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode} before it served{where}")
        try:
            if httpx.get(f"{url}/health", headers=headers, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not answer /health within {timeout_s:.0f} s{where}")
        time.sleep(poll_s)
