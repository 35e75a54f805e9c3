"""Append-only segment files holding the durable store's group payloads.

A POST costs one ``writev`` here instead of an SQLite transaction: the write lands in the page
cache before the broker answers, so it survives a kill -9 of the broker (as SQLite's WAL with
``synchronous=NORMAL`` does); :meth:`SegmentLog.sync` (called by the store's background thread)
makes it survive power loss too.

A record is ``<magic><length u32><crc32 u32><header>`` followed by the payloads it lists: the
header (msgpack, checked by its crc32) carries the broker state and each group's metadata,
payload size and payload crc32, so :meth:`SegmentLog.replay` can rebuild whatever SQLite has not
been told yet. Damage stays local: a record whose header fails its check is skipped up to the
next magic that starts an intact record (resynchronisation), a payload that fails its check
costs its own group only, and a torn or zero-filled tail (a crash or a power loss while
writing) is cut off. Each damaged stretch is logged and listed in :attr:`SegmentLog.damage`.
Records of earlier versions (no magic) are still read.
"""

from __future__ import annotations

import itertools
import logging
import os
import struct
import threading
import zlib
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import msgpack

logger = logging.getLogger(__name__)

SEGMENT_BYTES = 16 * 1024 * 1024
"""A segment is closed and a new one started once it holds this many bytes."""
_OPEN_READERS = 64
_IOV_MAX = max(16, os.sysconf("SC_IOV_MAX"))  # buffers per writev (1024 on Linux)
_MAGIC = b"\xa7SGR"
_FRAME = struct.Struct("<4sII")
_LEGACY_FRAME = struct.Struct("<II")
_SUFFIX = ".seg"


class LogPosition(NamedTuple):
    segment: int
    offset: int


class PayloadLocation(NamedTuple):
    segment: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class ReplayedRecord:
    header: dict[str, Any]
    payloads: list[PayloadLocation]
    end: LogPosition
    damaged: frozenset[int] = frozenset()
    """Indices of payloads that failed their crc32 (the header itself is intact)."""


@dataclass(frozen=True, slots=True)
class Damage:
    """A stretch of a segment that held no intact record: skipped, or cut off at the tail."""

    segment: int
    offset: int
    length: int
    cut: bool


def payload_crc(payload: bytes) -> int:
    return zlib.crc32(payload)


class SegmentLog:
    """Segments ``<n>.seg`` in one folder; one writer thread, :meth:`sync` from any thread."""

    def __init__(self, folder: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.folder = folder
        self.segment_bytes = segment_bytes
        folder.mkdir(parents=True, exist_ok=True)
        self._readers: dict[int, int] = {}
        self._sync_lock = threading.Lock()
        self._unsynced: set[int] = set()
        self.damage: list[Damage] = []
        existing = self.segments()
        self._active = existing[-1] if existing else 1
        self._writer = self._open_writer(self._active)
        self._end = os.fstat(self._writer).st_size

    def segments(self) -> list[int]:
        return sorted(int(p.stem) for p in self.folder.glob(f"*{_SUFFIX}") if p.stem.isdigit())

    def _path(self, segment: int) -> Path:
        return self.folder / f"{segment:010d}{_SUFFIX}"

    def _open_writer(self, segment: int) -> int:
        return os.open(self._path(segment), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    @property
    def active_segment(self) -> int:
        return self._active

    @property
    def end(self) -> LogPosition:
        return LogPosition(self._active, self._end)

    def append(self, header: dict[str, Any], payloads: Sequence[bytes]) -> list[PayloadLocation]:
        """Write one record; where each of its payloads now lies.

        Adds ``lengths`` and ``crcs`` (crc32 of each payload) to ``header`` before writing it.
        """
        if self._end >= self.segment_bytes:
            self.rotate()
        header["lengths"] = [len(payload) for payload in payloads]
        header["crcs"] = [payload_crc(payload) for payload in payloads]
        head = msgpack.packb(header, use_bin_type=True)
        frame = _FRAME.pack(_MAGIC, len(head), zlib.crc32(head))
        offset = self._end + len(frame) + len(head)
        locations = []
        for payload in payloads:
            locations.append(PayloadLocation(self._active, offset, len(payload)))
            offset += len(payload)
        with self._sync_lock:
            self._unsynced.add(self._active)
        self._write_all([frame, head, *payloads])
        return locations

    def _write_all(self, buffers: list[bytes]) -> None:
        """``writev`` in calls of at most IOV_MAX buffers, resuming after short writes; on an
        error (disk full) the file is cut back to where the record began, so that later records
        never follow a torn one."""
        start = self._end
        pending: deque[bytes | memoryview] = deque(buffers)
        try:
            while pending:
                written = os.writev(self._writer, list(itertools.islice(pending, _IOV_MAX)))
                if written == 0:
                    raise OSError(f"no progress writing {self._path(self._active)}")
                self._end += written
                while pending and written >= len(pending[0]):
                    written -= len(pending.popleft())
                if written:
                    pending[0] = memoryview(pending[0])[written:]
        except OSError:
            os.ftruncate(self._writer, start)
            self._end = start
            raise

    def rotate(self) -> None:
        """Close the active segment; the next record starts a new one."""
        with self._sync_lock:
            os.close(self._writer)
            self._active += 1
            self._writer = self._open_writer(self._active)
        self._end = 0

    def read(self, location: PayloadLocation) -> bytes:
        reader = self._readers.get(location.segment)
        if reader is None:
            if len(self._readers) >= _OPEN_READERS:
                self._close_readers()
            reader = os.open(self._path(location.segment), os.O_RDONLY)
            self._readers[location.segment] = reader
        data = os.pread(reader, location.length, location.offset)
        if len(data) != location.length:
            raise OSError(f"payload at {location} is cut short ({len(data)} bytes)")
        return data

    def replay(self, start: LogPosition) -> Iterator[ReplayedRecord]:
        """Intact records from ``start`` on, skipping damage; a damaged tail is cut off."""
        segments = [s for s in self.segments() if s >= start.segment]
        for segment in segments:
            offset = start.offset if segment == start.segment else 0
            with open(self._path(segment), "rb") as handle:
                data = handle.read()
            while offset < len(data):
                record = _parse(data, segment, offset)
                if record is not None:
                    yield record
                    offset = record.end.offset
                    continue
                resume = _next_record(data, segment, offset)
                last = segment == segments[-1] and resume == len(data)
                self._damaged(Damage(segment, offset, resume - offset, cut=last))
                offset = resume

    def _damaged(self, damage: Damage) -> None:
        self.damage.append(damage)
        where = f"{damage.segment}:{damage.offset}"
        if not damage.cut:
            logger.error(
                "segment log: %d damaged byte(s) at %s skipped; the records in them are lost, "
                "those after them kept", damage.length, where,
            )  # fmt: skip
            return
        logger.warning(
            "segment log: cutting %d byte(s) of torn or zeroed tail at %s (the broker stopped "
            "while writing them, before answering)", damage.length, where,
        )  # fmt: skip
        self.close()
        os.truncate(self._path(damage.segment), damage.offset)
        self._active = damage.segment
        self._writer = self._open_writer(damage.segment)
        self._end = damage.offset

    def sync(self) -> None:
        """fdatasync every segment written since the last call (safe from another thread)."""
        with self._sync_lock:
            pending, self._unsynced = self._unsynced, set()
            handles = [os.dup(self._writer)] if self._active in pending else []
            handles += [
                os.open(self._path(s), os.O_RDONLY)
                for s in pending
                if s != self._active and self._path(s).exists()
            ]
        for handle in handles:
            try:
                os.fdatasync(handle)
            finally:
                os.close(handle)

    def delete(self, segment: int) -> None:
        """Remove a closed segment nothing points into any more."""
        if segment == self._active:
            raise ValueError("the active segment cannot be deleted")
        reader = self._readers.pop(segment, None)
        if reader is not None:
            os.close(reader)
        with self._sync_lock:
            self._unsynced.discard(segment)
            self._path(segment).unlink(missing_ok=True)

    def delete_all(self) -> None:
        for segment in self.segments():
            if segment != self._active:
                self.delete(segment)
        with self._sync_lock:
            os.ftruncate(self._writer, 0)
        self._end = 0

    def _close_readers(self) -> None:
        for reader in self._readers.values():
            os.close(reader)
        self._readers.clear()

    def close(self) -> None:
        self._close_readers()
        with self._sync_lock:
            os.close(self._writer)


def _parse(data: bytes, segment: int, offset: int) -> ReplayedRecord | None:
    """The intact record at ``offset``, or None."""
    if data.startswith(_MAGIC, offset):
        frame = _FRAME
        if offset + frame.size > len(data):
            return None
        _, head_length, head_crc = frame.unpack_from(data, offset)
    else:  # written before records began with a magic
        frame = _LEGACY_FRAME
        if offset + frame.size > len(data):
            return None
        head_length, head_crc = frame.unpack_from(data, offset)
    head_start = offset + frame.size
    head = data[head_start : head_start + head_length]
    if not head or len(head) != head_length or zlib.crc32(head) != head_crc:
        return None
    try:
        header = msgpack.unpackb(head, raw=False)
    except (ValueError, msgpack.UnpackException):
        return None
    if not isinstance(header, dict) or "op" not in header:
        return None
    position = head_start + head_length
    payloads, damaged = [], set()
    lengths, crcs = header.get("lengths", ()), header.get("crcs", ())
    if len(lengths) != len(crcs) or position + sum(lengths) > len(data):
        return None  # torn: the payloads were not all written
    for index, (length, crc) in enumerate(zip(lengths, crcs, strict=True)):
        if payload_crc(data[position : position + length]) != crc:
            damaged.add(index)
        payloads.append(PayloadLocation(segment, position, length))
        position += length
    return ReplayedRecord(header, payloads, LogPosition(segment, position), frozenset(damaged))


def _next_record(data: bytes, segment: int, offset: int) -> int:
    """Where the first intact record after ``offset`` starts (``len(data)``: none)."""
    candidate = data.find(_MAGIC, offset + 1)
    while candidate != -1:
        if _parse(data, segment, candidate) is not None:
            return candidate
        candidate = data.find(_MAGIC, candidate + 1)
    return len(data)
