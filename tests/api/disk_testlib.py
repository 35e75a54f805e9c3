"""A small filesystem to fill: a size-limited tmpfs (as root), else a floor on a real disk."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MiB = 1024 * 1024


class SmallDisk:
    """``folder`` lies on a filesystem of about ``size`` bytes that :meth:`fill` fills up.

    With a tmpfs the filesystem really is that small and full means ENOSPC. Where mounting is
    not allowed, ``extra_floor`` is added to the broker's ``--min-free-bytes`` so that the
    broker sees the same few free bytes on the real disk (filled the same way, by a file).
    """

    def __init__(self, folder: Path, size: int, mounted: bool) -> None:
        self.folder = folder
        self.size = size
        self.mounted = mounted
        self.filler = folder / "filler"
        self.extra_floor = 0 if mounted else max(0, self.free() - size)

    def free(self) -> int:
        return shutil.disk_usage(self.folder).free

    def fill(self, leave: int = 0) -> None:
        """Write a file until only ``leave`` bytes (above ``extra_floor``) stay free."""
        with self.filler.open("ab") as handle:
            while (room := self.free() - self.extra_floor - leave) > 0:
                try:
                    handle.write(b"\xff" * min(room, MiB))
                    handle.flush()
                except OSError as err:
                    if err.errno != errno.ENOSPC:
                        raise
                    break

    def drain(self) -> None:
        self.filler.unlink(missing_ok=True)


@contextmanager
def small_disk(base: Path, size: int) -> Iterator[SmallDisk]:
    folder = base / "small-disk"
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)]
    mounted = (
        os.geteuid() == 0
        and shutil.which("mount") is not None
        and subprocess.run(mount, capture_output=True, check=False).returncode == 0
    )
    try:
        yield SmallDisk(folder, size, mounted)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], check=False)
