"""Reading scored groups: JSONL dumps (env ``process`` output) and broker batches.

A dump holds one group per line in the ``ScoredData`` shape (what an env's
``data_path_to_save_groups`` and ``process`` write). Groups handed out by the broker client
carry their per-token fields as numpy arrays; :func:`plain_group` turns them back into lists
so every consumer sees the same JSON shapes.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from atroposlib.errors import AtroposError
from atroposlib.group import ScoredData, invalid_group_reason

logger = logging.getLogger(__name__)

STDIN_PATH = "-"


class GroupFileError(AtroposError):
    """A dump line is not a valid group; the message names the file, the line and the field."""


def plain_group(group: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``group`` with numpy arrays (at any depth) turned into lists."""
    return {key: _plain(value) for key, value in group.items()}


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def parse_group(raw: Any, *, where: str) -> dict[str, Any]:
    """Validate one group against the wire contract; every ``ScoredData`` key is present."""
    try:
        model = ScoredData.model_validate(raw)
    except ValidationError as err:
        raise GroupFileError(f"{where}: {invalid_group_reason(err)}") from err
    return model.model_dump(mode="json")


def _open_lines(path: str) -> Iterator[str]:
    if path == STDIN_PATH:
        yield from sys.stdin
        return
    with Path(path).open(encoding="utf-8") as handle:
        yield from handle


def read_group_files(paths: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Yield every group of the given JSONL dumps in order; blank lines are skipped.

    A line may also hold a JSON array of groups (what a ``collect_trajectories`` returning
    several groups at once can produce); its groups are yielded in order.

    Raises :class:`GroupFileError` at the first line that is not JSON or not a group, and
    ``OSError`` when a file cannot be read.
    """
    for path in paths:
        for number, line in enumerate(_open_lines(path), start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as err:
                raise GroupFileError(f"{where}: not JSON ({err.msg})") from err
            if isinstance(raw, list):
                for index, item in enumerate(raw):
                    yield parse_group(item, where=f"{where}[{index}]")
            else:
                yield parse_group(raw, where=where)
