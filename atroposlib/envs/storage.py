"""Small file helpers shared by the modes."""

from __future__ import annotations

from pathlib import Path


def free_path(path: Path) -> Path:
    """``path``, or ``stem_1``, ``stem_2``... if it exists: earlier runs are never overwritten."""
    candidate, counter = path, 1
    while candidate.exists():
        candidate = path.with_stem(f"{path.stem}_{counter}")
        counter += 1
    return candidate
