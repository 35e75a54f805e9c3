"""The durable store (default): an SQLite file in WAL mode plus a folder of segment files.

Every change (groups accepted, a batch formed, delivered, released, groups dropped, the broker
state) is first one record appended to the segment log (:mod:`atroposlib.api.store.segments`),
payloads included, and touches no SQLite: a transaction per POST cost as much server CPU as
everything else the broker does. The log is applied to SQLite (metadata rows, batches, group ids,
state, the applied position) in one transaction every ``APPLY_EVERY`` changes and on close; on
start, whatever the log holds past the applied position is applied first. The append happened
before the broker answered, so whatever was answered 2xx survives a kill -9.

A background thread fdatasyncs the segments and then checkpoints the WAL every
``sync_interval`` seconds (``run-api --sync-interval``): a power loss can lose the writes of the
last interval (as SQLite's ``synchronous=NORMAL`` or Redis's ``appendfsync everysec``). At start
every stored payload is checked against its crc32, and a damaged one is reported in
``StoreSnapshot.corrupt`` instead of being served. Payloads stay in their segment (read with
``pread``); a segment is deleted once every record in it is applied and no group points into it,
and the few live payloads of an old, mostly released segment are copied forward (``COMPACT_BELOW``)
so that a long-waiting group does not keep a whole segment on disk.

Disk space (:mod:`atroposlib.api.store.space`): new groups are refused below ``min_free_bytes``
free; a change that frees space may use the disk reserve; an apply that fails (a full disk)
stays queued, the log holding the changes; and while space is short an emptied active segment
is closed so that it can be deleted, and recent sparse segments are compacted too.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import time
from collections import Counter, defaultdict
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import orjson

from atroposlib.api.store import sqlite_schema as sql
from atroposlib.api.store.background import Checkpointer, lock_store
from atroposlib.api.store.base import (
    DEFAULT_GROUP_IDS_KEPT,
    BatchRecord,
    GroupMeta,
    GroupStore,
    NewGroup,
    StoreSnapshot,
)
from atroposlib.api.store.seen import RecentIdFilter
from atroposlib.api.store.segments import (
    SEGMENT_BYTES,
    LogPosition,
    PayloadLocation,
    SegmentLog,
    payload_crc,
)
from atroposlib.api.store.space import DiskSpace

logger = logging.getLogger(__name__)

_PRUNE_EVERY = 10_000
APPLY_EVERY = 256
"""Changes written to the segment log before they are applied to SQLite in one transaction."""
COMPACT_BELOW = 0.25
"""A closed segment whose live payloads fill less than this share of it has them copied forward."""
_RECENT_SEGMENTS = 4  # the newest segments are left alone: their groups are usually used soon
_COMPACTIONS_PER_APPLY = 8
MIN_FREE_BYTES = 128 * 1024 * 1024
"""Default floor of free disk space below which new groups are refused (503)."""
_FULL_ERRNOS = frozenset((errno.ENOSPC, errno.EDQUOT))
SYNC_INTERVAL_S = 1.0
"""How often the background thread fdatasyncs segments and checkpoints the WAL after writes."""


class SqliteStore(GroupStore):
    def __init__(
        self,
        path: str | Path,
        *,
        group_ids_kept: int = DEFAULT_GROUP_IDS_KEPT,
        sync_interval: float = SYNC_INTERVAL_S,
        segment_bytes: int = SEGMENT_BYTES,
        min_free_bytes: int = MIN_FREE_BYTES,
    ) -> None:
        self.path = Path(path)
        self.description = f"sqlite:{self.path}"
        self._group_ids_kept = group_ids_kept
        self._inserts_since_prune = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = lock_store(self.path)
        self._db = sql.connect(self.path)
        self._log = SegmentLog(self.path.with_name(self.path.name + "-segments"), segment_bytes)
        self._space = DiskSpace(self._log.folder, min_free_bytes)
        self._pending: list[tuple[str, list[tuple[Any, ...]]]] = []
        self._pending_ids: dict[str, None] = {}
        self._pending_state: bytes | None = None
        self._pending_records = 0
        self._locations: dict[int, PayloadLocation] = {}
        self._segment_keys: defaultdict[int, set[int]] = defaultdict(set)
        self._live_bytes: Counter[int] = Counter()
        self._maybe_empty: set[int] = set()
        self._recent_ids = RecentIdFilter(group_ids_kept + _PRUNE_EVERY)
        self._checkpointer = Checkpointer(self.path, sync_interval, self._log.sync)
        self._checkpointer.start()

    @property
    def segments_folder(self) -> Path:
        return self._log.folder

    # -- the segment log and its application to SQLite ----------------------------------

    def _write(self, header: dict[str, Any], payloads: Sequence[bytes] = ()) -> None:
        """Log one change (durable from here on) and queue it for SQLite.

        Raises OSError when the change could not be logged (then nothing changed). A change
        that does not add groups may use the disk reserve: it is what frees space.
        """
        active = self._log.active_segment
        try:
            locations = self._log.append(header, payloads)
        except OSError as err:
            if err.errno not in _FULL_ERRNOS or header["op"] == "add":
                raise
            if not self._space.release_reserve():
                raise
            locations = self._log.append(header, payloads)
        finally:
            if self._log.active_segment != active:  # rotated (even if the write then failed)
                self._maybe_empty.add(active)
        self._space.written(sum(len(p) for p in payloads) + 256)
        self._checkpointer.dirty = True
        self._pend(header, locations)
        if self._pending_records >= APPLY_EVERY:
            self._apply_logged()

    def _apply_with_reserve(self, *, compact: bool = True) -> None:
        """:meth:`_apply`; on a full disk once more with the disk reserve given up."""
        try:
            self._apply(compact=compact)
        except (OSError, sqlite3.Error):
            if not self._space.release_reserve():
                raise
            self._apply(compact=compact)

    def _apply_logged(self, *, compact: bool = True) -> None:
        """:meth:`_apply`, whose failure (a full disk) leaves the changes queued for later:
        they are in the log already, and a later apply (or the next start) catches up."""
        try:
            self._apply_with_reserve(compact=compact)
        except (OSError, sqlite3.Error) as err:
            logger.warning("could not apply the log to SQLite (%s); retrying later", err)

    def _pend(
        self,
        header: dict[str, Any],
        locations: Sequence[PayloadLocation],
        damaged: Collection[int] = (),
    ) -> None:
        """What a logged change does to SQLite, queued in order (also used by the replay)."""
        op = header["op"]
        if op == "add":
            rows = []
            for (*meta, group_id), location, crc in zip(
                header["groups"], locations, header["crcs"], strict=True
            ):
                rows.append(sql.group_row(meta, location, crc))
                self._place(meta[0], location)
                if group_id is not None:
                    self._pending_ids[group_id] = None
                    self._recent_ids.add(group_id)
            self._queue_sql(sql.INSERT_GROUP, rows)
        elif op == "batch":
            row = (header["step"], orjson.dumps(header["keys"]), int(header["delivered"]))
            self._queue_sql(sql.INSERT_BATCH, [row])
        elif op == "delivered":
            flag = int(header["delivered"])
            self._queue_sql(sql.SET_DELIVERED, [(flag, step) for step in header["steps"]])
        elif op == "release":
            self._queue_sql(sql.DELETE_BATCH, [(step,) for step in header["steps"]])
        elif op == "move":
            moves = []
            for index, (key, location, crc) in enumerate(
                zip(header["keys"], locations, header["crcs"], strict=True)
            ):
                if index in damaged:
                    continue  # the copy is damaged: the group stays where it was
                self._forget([key])
                self._place(key, location)
                moves.append((location.segment, location.offset, crc, key))
            self._queue_sql(sql.MOVE_GROUP, moves)
        if op in ("release", "drop"):
            self._queue_sql(sql.DELETE_GROUP, [(key,) for key in header["keys"]])
            self._forget(header["keys"])
        if "state" in header:
            self._pending_state = header["state"]
        self._pending_records += 1

    def _queue_sql(self, statement: str, rows: list[tuple[Any, ...]]) -> None:
        if self._pending and self._pending[-1][0] == statement:
            self._pending[-1][1].extend(rows)
        else:
            self._pending.append((statement, rows))

    def _place(self, key: int, location: PayloadLocation) -> None:
        self._locations[key] = location
        self._segment_keys[location.segment].add(key)
        self._live_bytes[location.segment] += location.length

    def _forget(self, keys: Collection[int]) -> None:
        for key in keys:
            location = self._locations.pop(key, None)
            if location is not None:
                still_there = self._segment_keys[location.segment]
                still_there.discard(key)
                self._live_bytes[location.segment] -= location.length
                if not still_there:
                    self._maybe_empty.add(location.segment)

    def _apply(self, *, compact: bool = True) -> None:
        """One transaction bringing SQLite up to the end of the segment log."""
        short = self._space.short
        active = self._log.active_segment
        # (not while starting, compact=False: the index may not know every group yet)
        if compact and short and self._log.end.offset and not self._segment_keys.get(active):
            self._log.rotate()  # nothing live in it: once applied, it can be deleted
            self._maybe_empty.add(active)
        end = self._log.end
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for statement, rows in self._pending:
                self._db.executemany(statement, rows)
            self._remember_ids()
            if self._pending_state is not None:
                self._db.execute(
                    "INSERT OR REPLACE INTO state (id, body) VALUES (0, ?)", (self._pending_state,)
                )
            self._db.execute(
                "INSERT OR REPLACE INTO log_position (id, segment, offset) VALUES (0, ?, ?)", end
            )
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        self._pending.clear()
        self._pending_ids.clear()
        self._pending_state = None
        self._pending_records = 0
        self._checkpointer.dirty = True
        for segment in [s for s in self._maybe_empty if s < end.segment]:
            self._maybe_empty.discard(segment)  # every record in it is applied: safe to delete
            if not self._segment_keys.get(segment):
                self._segment_keys.pop(segment, None)
                self._live_bytes.pop(segment, None)
                self._log.delete(segment)
        if compact:
            self._compact(short)
        if not short:
            self._space.ensure_reserve()

    def _compact(self, short: bool = False) -> None:
        """Copy the few live payloads of old, mostly released segments forward (a "move").

        Without this, one group that waits long (a rarely picked env) would keep its whole
        segment on disk; the emptied segment is deleted once the move is applied.
        """
        oldest_kept = self._log.active_segment - (0 if short else _RECENT_SEGMENTS)
        sparse = [
            segment
            for segment, live_bytes in sorted(self._live_bytes.items())
            if segment < oldest_kept and 0 < live_bytes < COMPACT_BELOW * self._log.segment_bytes
        ][:_COMPACTIONS_PER_APPLY]
        for segment in sparse:
            keys = sorted(self._segment_keys[segment])
            try:
                payloads = [self._log.read(self._locations[key]) for key in keys]
            except OSError as err:  # the groups stay where they are; a later apply retries
                logger.warning("could not compact segment %d: %s", segment, err)
                continue
            self._write({"op": "move", "keys": keys}, payloads)
            logger.debug("moved %d group(s) out of segment %d", len(keys), segment)

    def _remember_ids(self) -> None:
        if not self._pending_ids:
            return
        self._db.executemany(
            "INSERT OR IGNORE INTO group_ids (group_id) VALUES (?)",
            [(group_id,) for group_id in self._pending_ids],
        )
        self._inserts_since_prune += len(self._pending_ids)
        if self._inserts_since_prune >= _PRUNE_EVERY:
            self._inserts_since_prune = 0
            self._db.execute(
                "DELETE FROM group_ids WHERE seq <= (SELECT MAX(seq) FROM group_ids) - ?",
                (self._group_ids_kept,),
            )

    # -- start -------------------------------------------------------------------------

    def _clear_index(self) -> None:
        """Forget where payloads lie (and which ids were seen): rebuilt from SQLite by load()."""
        self._locations.clear()
        self._segment_keys.clear()
        self._live_bytes.clear()
        self._maybe_empty.clear()
        self._recent_ids.clear()

    def load(self) -> StoreSnapshot:
        self._replay_log()
        self._clear_index()
        snapshot = StoreSnapshot()
        row = self._db.execute("SELECT body FROM state WHERE id = 0").fetchone()
        if row is not None:
            snapshot.state = orjson.loads(row[0])
        for step, keys, delivered in self._db.execute(
            "SELECT step, keys, delivered FROM batches ORDER BY step"
        ):
            snapshot.batches.append(BatchRecord(step, tuple(orjson.loads(keys)), bool(delivered)))
        in_batches = {key for batch in snapshot.batches for key in batch.keys}
        snapshot.log_damage = len(self._log.damage)
        self._log.damage.clear()
        for (group_id,) in self._db.execute("SELECT group_id FROM group_ids ORDER BY seq"):
            self._recent_ids.add(group_id)
        query = (
            "SELECT key, env_id, size, tokens, max_len, nbytes, policy_version, batch_step,"
            " segment, offset, crc FROM groups ORDER BY key"
        )
        started, checked_bytes = time.perf_counter(), 0
        for *fields, batch_step, segment, offset, crc in self._db.execute(query):
            meta = GroupMeta(*fields)
            # batch_step: set by earlier versions; batch membership now lives in `batches` only
            if batch_step is None and meta.key not in in_batches:
                snapshot.queued.append(meta)
            else:
                snapshot.batched[meta.key] = meta
            if segment is not None:
                location = PayloadLocation(segment, offset, meta.nbytes)
                self._place(meta.key, location)
                if payload_crc(self._read(location)) != crc:
                    snapshot.corrupt.add(meta.key)
                checked_bytes += meta.nbytes
        # a batch whose groups' record was lost to damage cannot be served whole
        snapshot.corrupt |= in_batches - snapshot.batched.keys()
        if checked_bytes:
            logger.info(
                "checked %d stored payload(s), %.1f MB, in %.2f s",
                len(self._locations), checked_bytes / 1e6, time.perf_counter() - started,
            )  # fmt: skip
        self._maybe_empty.update(self._log.segments())
        self._apply_with_reserve(compact=False)  # deletes segments nothing points into
        return snapshot

    def _read(self, location: PayloadLocation) -> bytes:
        try:
            return self._log.read(location)
        except OSError:
            return b""  # a missing or short segment: the crc check reports the group

    def _replay_log(self) -> None:
        """Apply to SQLite what the segment log holds past its last applied position."""
        row = self._db.execute("SELECT segment, offset FROM log_position WHERE id = 0").fetchone()
        segments = self._log.segments()
        start = LogPosition(*row) if row else LogPosition(segments[0] if segments else 1, 0)
        replayed = 0
        for record in self._log.replay(start):
            self._pend(record.header, record.payloads, record.damaged)
            replayed += 1
        if replayed:
            logger.info("replayed %d change(s) from the segment log", replayed)
            # The index knows only the replayed groups until load() reads SQLite: a segment it
            # thinks empty may still hold older groups, so nothing is deleted or moved yet.
            self._maybe_empty.clear()
            self._apply_with_reserve(compact=False)

    # -- the store interface -----------------------------------------------------------

    def add_groups(self, groups: Sequence[NewGroup], state: dict[str, Any]) -> None:
        blobs = [g.blob for g in groups]
        self._space.check_room(sum(len(blob) for blob in blobs))
        header = {
            "op": "add",
            "state": orjson.dumps(state),
            "groups": [
                [
                    g.meta.key, g.meta.env_id, g.meta.size, g.meta.tokens, g.meta.max_len,
                    g.meta.nbytes, g.meta.policy_version, g.group_id,
                ]
                for g in groups
            ],
        }  # fmt: skip
        self._write(header, blobs)

    def seen_group_ids(self, group_ids: Collection[str]) -> set[str]:
        maybe = [group_id for group_id in group_ids if self._recent_ids.may_contain(group_id)]
        seen = {group_id for group_id in maybe if group_id in self._pending_ids}
        ids = [group_id for group_id in maybe if group_id not in seen]
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            query = f"SELECT group_id FROM group_ids WHERE group_id IN ({marks})"
            seen.update(row[0] for row in self._db.execute(query, chunk))
        return seen

    def payloads(self, keys: Sequence[int]) -> list[bytes]:
        in_rows = [key for key in keys if key not in self._locations]
        found = {}
        if in_rows:  # groups stored by versions that kept payloads inside SQLite
            marks = ",".join("?" * len(in_rows))
            query = f"SELECT key, payload FROM groups WHERE key IN ({marks})"
            found = dict(self._db.execute(query, in_rows))
        return [
            self._log.read(self._locations[key]) if key in self._locations else found[key]
            for key in keys
        ]

    def drop_groups(self, keys: Collection[int], state: dict[str, Any]) -> None:
        self._write({"op": "drop", "keys": list(keys), "state": orjson.dumps(state)})

    def save_batch(self, batch: BatchRecord, state: dict[str, Any]) -> None:
        self._write(
            {
                "op": "batch", "step": batch.step, "keys": list(batch.keys),
                "delivered": batch.delivered, "state": orjson.dumps(state),
            }
        )  # fmt: skip

    def set_delivered(self, steps: Collection[int], delivered: bool, state: dict[str, Any]) -> None:
        self._write(
            {
                "op": "delivered", "steps": list(steps), "delivered": delivered,
                "state": orjson.dumps(state),
            }
        )  # fmt: skip

    def release_batches(self, batches: Sequence[BatchRecord], state: dict[str, Any]) -> None:
        self._write(
            {
                "op": "release", "steps": [b.step for b in batches],
                "keys": [key for batch in batches for key in batch.keys],
                "state": orjson.dumps(state),
            }
        )  # fmt: skip

    def save_state(self, state: dict[str, Any]) -> None:
        self._write({"op": "state", "state": orjson.dumps(state)})

    def reset(self) -> None:
        self._pending.clear()
        self._pending_ids.clear()
        self._pending_state = None
        self._pending_records = 0
        self._log.delete_all()
        self._clear_index()
        self._db.execute("BEGIN IMMEDIATE")
        for table in ("groups", "batches", "group_ids", "state", "log_position"):
            self._db.execute(f"DELETE FROM {table}")
        self._db.execute("COMMIT")

    def close(self) -> None:
        if self._pending_records:
            self._apply_logged(compact=False)  # spares the next start a replay
        self._checkpointer.stop()
        self._db.close()
        self._log.close()
        self._lock.close()
