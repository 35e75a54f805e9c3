"""What a step found: figures and pass/fail checks, written to disk as they come (a step cut
off by its time limit keeps what it had measured)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class Result:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.figures: dict[str, Any] = {}
        self.checks: list[dict[str, Any]] = []
        self.save()

    def add(self, **figures: Any) -> None:
        self.figures.update({k: _plain(v) for k, v in figures.items()})
        self.save()

    def check(self, name: str, ok: bool, value: Any, bound: str) -> bool:
        """Record a pass/fail check: ``value`` against ``bound`` (said in words)."""
        self.checks.append({"name": name, "ok": bool(ok), "value": _plain(value), "bound": bound})
        self.save()
        return bool(ok)

    def save(self) -> None:
        body = {"figures": self.figures, "checks": self.checks}
        self.path.write_text(json.dumps(body, indent=1, default=str) + "\n")


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if hasattr(value, "item"):
        return _plain(value.item())
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
