"""A local file of groups the broker has not acknowledged yet; replayed until it has."""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import orjson

logger = logging.getLogger(__name__)


class Spool:
    """Append-only JSONL of ``{"add": group}`` / ``{"ack": group_id}`` records.

    Pending groups survive a crash of the env: opening the file replays it. The file is
    truncated whenever nothing is pending.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.pending: OrderedDict[str, dict[str, Any]] = OrderedDict()
        if self.path.exists():
            self._replay()
        self._file = self.path.open("ab")

    def _replay(self) -> None:
        with self.path.open("rb") as handle:
            for line in handle:
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError:
                    logger.warning(
                        "spool %s: skipping a torn line (crash while writing)", self.path
                    )
                    continue
                if "add" in record:
                    self.pending[record["add"]["group_id"]] = record["add"]
                else:
                    self.pending.pop(record["ack"], None)
        if self.pending:
            logger.info("spool %s: %d groups still to send", self.path, len(self.pending))

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, groups: list[dict[str, Any]]) -> None:
        for group in groups:
            self.pending[group["group_id"]] = group
            self._file.write(orjson.dumps({"add": group}) + b"\n")
        self._sync()

    def ack(self, group_ids: list[str]) -> None:
        for group_id in group_ids:
            self.pending.pop(group_id, None)
            self._file.write(orjson.dumps({"ack": group_id}) + b"\n")
        if not self.pending:
            self._file.truncate(0)
            self._file.seek(0)
        self._sync()

    def oldest(self, limit: int) -> list[dict[str, Any]]:
        return [group for _, group in zip(range(limit), self.pending.values(), strict=False)]

    def _sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()
