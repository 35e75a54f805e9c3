"""What runs beside the durable store: the fsync + WAL checkpoint thread and the store's lock."""

from __future__ import annotations

import fcntl
import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from atroposlib.errors import ConfigError

logger = logging.getLogger(__name__)


class Checkpointer(threading.Thread):
    """Syncs the segments, then checkpoints the WAL, whenever something was written."""

    def __init__(self, path: Path, interval: float, sync_segments: Callable[[], None]) -> None:
        super().__init__(name=f"sqlite-checkpoint:{path.name}", daemon=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.interval = interval
        self._sync_segments = sync_segments
        self._stop_event = threading.Event()
        self.dirty = False

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            if self.dirty:
                self.dirty = False
                self.checkpoint()

    def checkpoint(self) -> None:
        try:
            self._sync_segments()
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except (OSError, sqlite3.Error) as err:  # the next round retries; nothing is lost
            logger.warning("segment sync / WAL checkpoint failed (%s); retrying later", err)
            self.dirty = True

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        self._db.close()


def lock_store(path: Path) -> IO[str]:
    """Hold an exclusive lock next to the database: one broker per store (freed on any exit)."""
    handle = open(path.with_name(path.name + ".lock"), "w")  # noqa: SIM115 - held until close
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as err:
        handle.close()
        raise ConfigError(
            f"another broker is using {path}; stop it or pass a different --store"
        ) from err
    return handle
