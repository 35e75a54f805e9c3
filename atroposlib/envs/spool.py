"""A local file of groups the broker has not acknowledged yet; replayed until it has."""

from __future__ import annotations

import fcntl
import logging
import os
import re
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any

import orjson

from atroposlib.errors import ConfigError

logger = logging.getLogger(__name__)

MAX_INSTANCES = 64
"""Running instances of one env that may spool in one folder at once."""


def _locked(path: Path) -> IO[bytes] | None:
    """``path`` opened for appending under an exclusive lock; None if another process holds it."""
    while True:
        handle = path.open("ab+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return None
        try:
            same = os.fstat(handle.fileno()).st_ino == path.stat().st_ino
        except FileNotFoundError:
            same = False
        if same:
            return handle
        handle.close()  # removed (adopted) between our open and our lock: open it again


class Spool:
    """Append-only JSONL of ``{"add": group}`` / ``{"ack": group_id}`` records.

    Pending groups survive a crash of the env: opening the file replays it. The file is
    truncated whenever nothing is pending. Each running instance holds its own file under an
    exclusive lock: the first takes ``path``, a second one in the same folder ``<stem>.2<ext>``,
    and so on. Opening a spool also adopts the files of instances that are no longer running
    (nobody holds their lock): their pending groups move into this instance's file and their
    files are removed, so a restarted env sends what its predecessors left, once (every group
    keeps its ``group_id``, which the broker deduplicates on).
    """

    def __init__(self, path: str | Path) -> None:
        requested = Path(path)
        requested.parent.mkdir(parents=True, exist_ok=True)
        self.pending: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.path, self._file = self._claim(requested)
        self._replay(self._file)
        self._adopt_orphans(requested)
        if self.pending:
            logger.info("spool %s: %d groups still to send", self.path, len(self.pending))

    @staticmethod
    def _slot(requested: Path, number: int) -> Path:
        return requested if number == 1 else requested.with_name(
            f"{requested.stem}.{number}{requested.suffix}"
        )  # fmt: skip

    def _claim(self, requested: Path) -> tuple[Path, IO[bytes]]:
        for number in range(1, MAX_INSTANCES + 1):
            path = self._slot(requested, number)
            handle = _locked(path)
            if handle is not None:
                if number > 1:
                    logger.info("spool %s is in use by another instance: using %s", requested, path)
                return path, handle
        raise ConfigError(
            f"{MAX_INSTANCES} running instances already spool to {requested}; give this one "
            "another --env.wandb_name or run it from another folder"
        )

    def _siblings(self, requested: Path) -> list[Path]:
        pattern = re.compile(re.escape(requested.stem) + r"\.\d+" + re.escape(requested.suffix))
        numbered = [p for p in requested.parent.iterdir() if pattern.fullmatch(p.name)]
        return [p for p in [requested, *sorted(numbered)] if p != self.path and p.exists()]

    def _adopt_orphans(self, requested: Path) -> None:
        for orphan in self._siblings(requested):
            handle = _locked(orphan)
            if handle is None:
                continue  # a running instance's own spool
            with handle:
                before = len(self.pending)
                adopted = self._read(handle)
                for group_id, group in adopted.items():
                    if group_id not in self.pending:
                        self.pending[group_id] = group
                        self._file.write(orjson.dumps({"add": group}) + b"\n")
                self._sync()
                orphan.unlink()  # under its lock: no one else adopts it twice
            logger.info(
                "spool %s: took over %d pending group(s) from %s, left by a stopped instance",
                self.path, len(self.pending) - before, orphan,
            )  # fmt: skip

    def _read(self, handle: IO[bytes]) -> OrderedDict[str, dict[str, Any]]:
        pending: OrderedDict[str, dict[str, Any]] = OrderedDict()
        handle.seek(0)
        for line in handle:
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                logger.warning("spool %s: skipping a torn line (crash while writing)", handle.name)
                continue
            if "add" in record:
                pending[record["add"]["group_id"]] = record["add"]
            else:
                pending.pop(record["ack"], None)
        return pending

    def _replay(self, handle: IO[bytes]) -> None:
        self.pending.update(self._read(handle))
        handle.seek(0, os.SEEK_END)
        if handle.tell():
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":  # a torn last line: later records start on their own
                handle.write(b"\n")

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
