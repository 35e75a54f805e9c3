"""Evaluation output: ``metrics.json`` (lighteval-style, as Atropos wrote it) and samples.

While an evaluation runs, ``gather_with_progress`` keeps ``progress.json`` (``{"done": n,
"total": m}``) current in the output folder and logs every tenth of the way, so a launcher or a
person tailing the log sees it advance.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from atroposlib.envs.atropos_output import jsonl_line

T = TypeVar("T")
PROGRESS_FILE = "progress.json"

logger = logging.getLogger(__name__)


def write_eval_results(
    directory: str | Path,
    *,
    metrics: dict[str, Any],
    task_name: str,
    model_name: str,
    seconds: float,
    generation_parameters: dict[str, Any],
    samples: list[dict[str, Any]] | None,
) -> Path:
    """Write ``metrics.json`` and, when given, ``samples.jsonl``; returns the metrics path."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    result = {
        "config_general": {
            "model_name": model_name,
            "total_evaluation_time_seconds": str(seconds),
            "generation_parameters": generation_parameters,
        },
        "results": {f"atropos|{task_name}|0": metrics, "all": metrics},
    }
    path = folder / "metrics.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    if samples:
        with (folder / "samples.jsonl").open("wb") as handle:
            for sample in samples:
                handle.write(jsonl_line(sample))
    logger.info("evaluation results written to %s", folder)
    return path


class EvalProgress:
    """Counts answered eval items into ``<folder>/progress.json`` (atomic) and the log."""

    def __init__(self, folder: str | Path | None, total: int, min_interval_s: float = 1.0) -> None:
        self.path = Path(folder) / PROGRESS_FILE if folder is not None else None
        self.total, self.done = total, 0
        self.min_interval_s = min_interval_s
        self._written_at = -float("inf")
        self._logged_tenth = 0
        self._write()

    def advance(self) -> None:
        self.done += 1
        tenth = self.done * 10 // max(self.total, 1)
        if tenth > self._logged_tenth:
            self._logged_tenth = tenth
            logger.info("evaluation: %d/%d answered", self.done, self.total)
        if self.done == self.total or time.monotonic() - self._written_at >= self.min_interval_s:
            self._write()

    def _write(self) -> None:
        self._written_at = time.monotonic()
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".tmp")
        partial.write_text(json.dumps({"done": self.done, "total": self.total}))
        os.replace(partial, self.path)


def read_progress(folder: Path) -> tuple[int, int] | None:
    """(done, total) from a running evaluation's ``progress.json``; None before it starts."""
    try:
        data = json.loads((folder / PROGRESS_FILE).read_text())
        return int(data["done"]), int(data["total"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


async def gather_with_progress(
    awaitables: Sequence[Awaitable[T]], folder: str | Path | None
) -> list[T]:
    """``asyncio.gather`` that reports each finished item through ``EvalProgress``."""
    progress = EvalProgress(folder, len(awaitables))

    async def counted(awaitable: Awaitable[T]) -> T:
        result = await awaitable
        progress.advance()
        return result

    return list(await asyncio.gather(*(counted(a) for a in awaitables)))
