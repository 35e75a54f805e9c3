"""Env checkpoints: a JSON dict per step under ``<checkpoint_dir>/env_checkpoints/<env name>``."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def checkpoint_path(checkpoint_dir: str, env_name: str, step: int) -> Path:
    return Path(checkpoint_dir) / "env_checkpoints" / env_name / f"step-{step}.json"


def save_checkpoint(checkpoint_dir: str, env_name: str, step: int, data: dict[str, Any]) -> Path:
    """Write atomically (temp file + rename) so a crash never leaves half a checkpoint."""
    path = checkpoint_path(checkpoint_dir, env_name, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)
    logger.info("env checkpoint saved: %s", path)
    return path


def load_checkpoint(checkpoint_dir: str, env_name: str, step: int) -> dict[str, Any] | None:
    """The checkpoint for ``step``, or the latest one before it, or ``None``."""
    folder = Path(checkpoint_dir) / "env_checkpoints" / env_name
    if not folder.is_dir():
        return None
    steps = sorted(
        int(p.stem.removeprefix("step-"))
        for p in folder.glob("step-*.json")
        if p.stem.removeprefix("step-").isdigit()
    )
    usable = [s for s in steps if s <= step]
    if not usable:
        return None
    data = json.loads(checkpoint_path(checkpoint_dir, env_name, usable[-1]).read_text())
    return data if isinstance(data, dict) else None
