"""The export loop: groups in, JSONL lines out, each batch on disk before it is acknowledged."""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from atroposlib.errors import AtroposError
from atroposlib.export.sources import GroupSource

logger = logging.getLogger(__name__)

LineMaker = Callable[[dict[str, Any], Counter[str]], list[dict[str, Any]]]
ProgressCallback = Callable[["ExportResult"], None]


class OutputExistsError(AtroposError):
    """The output file exists and appending was not asked for."""


@dataclass
class ExportResult:
    lines_written: int = 0
    groups_read: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    source_exhausted: bool = False
    """True when the input ran out (or the broker went idle) before the line target."""


def open_output(path: Path, *, append: bool) -> TextIO:
    """Open ``path`` for writing lines; refuses to touch an existing file unless appending."""
    if path.exists() and not append:
        raise OutputExistsError(
            f"{path} already exists; pass --append-to-previous to add to it, "
            "or choose another output path"
        )
    if path.parent != Path() and not path.parent.is_dir():
        raise OutputExistsError(f"{path.parent} is not a directory; create it first")
    return path.open("a" if append else "x", encoding="utf-8")


def _sync(handle: TextIO) -> None:
    handle.flush()
    os.fsync(handle.fileno())


def run_export(
    source: GroupSource,
    make_lines: LineMaker,
    output: TextIO,
    limit: int,
    on_progress: ProgressCallback | None = None,
    partial: ExportResult | None = None,
) -> ExportResult:
    """Write up to ``limit`` lines made from the source's groups; returns what happened.

    Lines of a batch are written and synced before the source is told the batch is done,
    so a broker batch is acknowledged only once its data is durable. Counts go into
    ``partial`` when given, so a caller still has them if the source raises midway.
    """
    result = partial if partial is not None else ExportResult()
    for batch in source.batches():
        for group in batch.groups:
            if result.lines_written >= limit:
                break
            result.groups_read += 1
            lines = make_lines(group, result.skipped)
            room = limit - result.lines_written
            if len(lines) > room:
                result.skipped["over_limit"] += len(lines) - room
            for line in lines[:room]:
                output.write(json.dumps(line, ensure_ascii=False) + "\n")
            result.lines_written += min(len(lines), room)
        _sync(output)
        source.written(batch)
        if on_progress is not None:
            on_progress(result)
        if result.lines_written >= limit:
            return result
    result.source_exhausted = True
    return result
