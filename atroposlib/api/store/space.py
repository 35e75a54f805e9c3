"""Disk space of the durable store: a free-space floor for new groups, and an emergency reserve.

New groups are refused (the broker answers 503 + Retry-After) once accepting them would leave
less than ``min_free_bytes`` free on the store's filesystem, so that what frees space (acks,
releases, compaction, SQLite's own writes) always finds room. If the disk fills anyway (another
program wrote to it), a reserve file kept beside the segments is given up to let those writes
through, and taken again once space has come back.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path

logger = logging.getLogger(__name__)

RESERVE_FILE_BYTES = 8 * 1024 * 1024
"""Upper bound of the emergency reserve file (a quarter of ``min_free_bytes`` when smaller)."""
_CHECK_EVERY_S = 0.1


class DiskSpace:
    """Free space of one folder's filesystem, read at most every 100 ms (writes counted)."""

    def __init__(self, folder: Path, min_free_bytes: int) -> None:
        self.folder = folder
        self.min_free_bytes = min_free_bytes
        self.reserve_path = folder / "reserve"
        self.reserve_bytes = min(RESERVE_FILE_BYTES, min_free_bytes // 4)
        self._free = 0
        self._checked_at = -1.0
        self.ensure_reserve()

    def free(self, *, fresh: bool = False) -> int:
        now = time.monotonic()
        if fresh or now - self._checked_at > _CHECK_EVERY_S:
            stats = os.statvfs(self.folder)
            self._free = stats.f_bavail * stats.f_frsize
            self._checked_at = now
        return self._free

    def written(self, nbytes: int) -> None:
        self._free -= nbytes

    @property
    def short(self) -> bool:
        """Less than the floor is free: new groups are refused, space should be given back."""
        return self.free() < self.min_free_bytes

    def check_room(self, nbytes: int) -> None:
        """Raise ENOSPC when ``nbytes`` more would leave less than the floor free."""
        if self.free() - nbytes >= self.min_free_bytes:
            return
        if self.free(fresh=True) - nbytes >= self.min_free_bytes:
            return
        raise OSError(
            errno.ENOSPC,
            f"{self._free / 2**20:.1f} MiB free on the store's disk, below its floor of "
            f"{self.min_free_bytes / 2**20:.1f} MiB (min_free_bytes)",
        )

    def ensure_reserve(self) -> None:
        """Take the reserve file again when there is room for it above the floor."""
        if self.reserve_bytes <= 0 or self.reserve_path.exists():
            return
        if self.free(fresh=True) < self.min_free_bytes + 2 * self.reserve_bytes:
            return
        handle = os.open(self.reserve_path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(handle, 0, self.reserve_bytes)
        except OSError as err:
            os.close(handle)
            self.reserve_path.unlink(missing_ok=True)
            logger.warning("could not set aside the disk reserve: %s", err)
            return
        os.close(handle)
        self.written(self.reserve_bytes)

    def release_reserve(self) -> bool:
        """Give the reserve file back to the filesystem; False when there was none."""
        if not self.reserve_path.exists():
            return False
        self.reserve_path.unlink()
        logger.warning(
            "the store's disk is full: released its %.1f MiB reserve so that acks and "
            "compaction can free space", self.reserve_bytes / 2**20,
        )  # fmt: skip
        self.free(fresh=True)
        return True
