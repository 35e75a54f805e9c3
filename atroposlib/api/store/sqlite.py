"""The durable store (default): one SQLite file in WAL mode.

Each mutating call is one transaction that also writes the broker state, and it has committed
before the broker answers, so whatever was answered 2xx survives a kill -9 (WAL with
``synchronous=NORMAL`` loses at most transactions of the last moment on power loss, not on a
process crash). Payloads stay on disk; only small metadata is read back at start.

Checkpoints (copying the WAL into the database file, with its fsyncs) run in a background
thread on their own connection instead of inside whichever commit crosses SQLite's
auto-checkpoint threshold: on a busy disk that commit took up to ~100 ms, the broker's p99
POST latency. Commits themselves are unchanged.
"""

from __future__ import annotations

import fcntl
import logging
import sqlite3
import threading
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import orjson

from atroposlib.api.store.base import (
    DEFAULT_GROUP_IDS_KEPT,
    BatchRecord,
    GroupMeta,
    GroupStore,
    NewGroup,
    StoreSnapshot,
)
from atroposlib.errors import ConfigError

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS groups (
    key INTEGER PRIMARY KEY, env_id INTEGER, size INTEGER NOT NULL, tokens INTEGER NOT NULL,
    max_len INTEGER NOT NULL, nbytes INTEGER NOT NULL, policy_version INTEGER,
    batch_step INTEGER, payload BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    step INTEGER PRIMARY KEY, keys BLOB NOT NULL, delivered INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS group_ids (seq INTEGER PRIMARY KEY, group_id TEXT UNIQUE NOT NULL);
CREATE TABLE IF NOT EXISTS state (id INTEGER PRIMARY KEY CHECK (id = 0), body BLOB NOT NULL);
"""
_PRUNE_EVERY = 10_000
CHECKPOINT_INTERVAL_S = 0.25
"""How often the background thread checkpoints the WAL when something was committed."""


class _Checkpointer(threading.Thread):
    """Checkpoints the WAL (PASSIVE: never blocks the writer) when commits happened."""

    def __init__(self, path: Path, interval: float) -> None:
        super().__init__(name=f"sqlite-checkpoint:{path.name}", daemon=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._interval = interval
        self._stop_event = threading.Event()
        self.dirty = False

    def run(self) -> None:
        while not self._stop_event.wait(self._interval):
            if self.dirty:
                self.dirty = False
                self.checkpoint()

    def checkpoint(self) -> None:
        try:
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as err:  # the next round retries; the WAL keeps every commit
            logger.warning("WAL checkpoint failed (%s); retrying later", err)
            self.dirty = True

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        self._db.close()


def _lock_file(path: Path) -> IO[str]:
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


class SqliteStore(GroupStore):
    def __init__(
        self,
        path: str | Path,
        *,
        group_ids_kept: int = DEFAULT_GROUP_IDS_KEPT,
        checkpoint_interval: float = CHECKPOINT_INTERVAL_S,
    ) -> None:
        self.path = Path(path)
        self.description = f"sqlite:{self.path}"
        self._group_ids_kept = group_ids_kept
        self._inserts_since_prune = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = _lock_file(self.path)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._db.executescript(_SCHEMA)
        self._checkpointer = _Checkpointer(self.path, checkpoint_interval)
        self._checkpointer.start()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        self._checkpointer.dirty = True

    @staticmethod
    def _write_state(db: sqlite3.Connection, state: dict[str, Any]) -> None:
        db.execute("INSERT OR REPLACE INTO state (id, body) VALUES (0, ?)", (orjson.dumps(state),))

    def load(self) -> StoreSnapshot:
        snapshot = StoreSnapshot()
        row = self._db.execute("SELECT body FROM state WHERE id = 0").fetchone()
        if row is not None:
            snapshot.state = orjson.loads(row[0])
        for step, keys, delivered in self._db.execute(
            "SELECT step, keys, delivered FROM batches ORDER BY step"
        ):
            snapshot.batches.append(BatchRecord(step, tuple(orjson.loads(keys)), bool(delivered)))
        in_batches = {key for batch in snapshot.batches for key in batch.keys}
        query = (
            "SELECT key, env_id, size, tokens, max_len, nbytes, policy_version, batch_step "
            "FROM groups ORDER BY key"
        )
        for *fields, batch_step in self._db.execute(query):
            meta = GroupMeta(*fields)
            # batch_step: set by earlier versions; batch membership now lives in `batches` only
            if batch_step is None and meta.key not in in_batches:
                snapshot.queued.append(meta)
            else:
                snapshot.batched[meta.key] = meta
        return snapshot

    def add_groups(self, groups: Sequence[NewGroup], state: dict[str, Any]) -> None:
        rows = [
            (
                g.meta.key, g.meta.env_id, g.meta.size, g.meta.tokens, g.meta.max_len,
                g.meta.nbytes, g.meta.policy_version, g.blob,
            )
            for g in groups
        ]  # fmt: skip
        ids = [(g.group_id,) for g in groups if g.group_id is not None]
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO groups (key, env_id, size, tokens, max_len, nbytes, policy_version,"
                " payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            db.executemany("INSERT OR IGNORE INTO group_ids (group_id) VALUES (?)", ids)
            self._write_state(db, state)
            self._inserts_since_prune += len(ids)
            if self._inserts_since_prune >= _PRUNE_EVERY:
                self._inserts_since_prune = 0
                db.execute(
                    "DELETE FROM group_ids WHERE seq <= (SELECT MAX(seq) FROM group_ids) - ?",
                    (self._group_ids_kept,),
                )

    def seen_group_ids(self, group_ids: Collection[str]) -> set[str]:
        seen: set[str] = set()
        ids = list(group_ids)
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            query = f"SELECT group_id FROM group_ids WHERE group_id IN ({marks})"
            seen.update(row[0] for row in self._db.execute(query, chunk))
        return seen

    def payloads(self, keys: Sequence[int]) -> list[bytes]:
        found = {
            key: blob
            for key, blob in self._db.execute(
                f"SELECT key, payload FROM groups WHERE key IN ({','.join('?' * len(keys))})",
                list(keys),
            )
        }
        return [found[key] for key in keys]

    def drop_groups(self, keys: Collection[int], state: dict[str, Any]) -> None:
        with self._transaction() as db:
            db.executemany("DELETE FROM groups WHERE key = ?", [(k,) for k in keys])
            self._write_state(db, state)

    def save_batch(self, batch: BatchRecord, state: dict[str, Any]) -> None:
        with self._transaction() as db:
            # Membership is recorded here only: an UPDATE of the group rows would rewrite
            # every payload (SQLite rewrites a whole record), ~tens of KB per group.
            db.execute(
                "INSERT OR REPLACE INTO batches (step, keys, delivered) VALUES (?, ?, ?)",
                (batch.step, orjson.dumps(list(batch.keys)), int(batch.delivered)),
            )
            self._write_state(db, state)

    def set_delivered(self, steps: Collection[int], delivered: bool, state: dict[str, Any]) -> None:
        with self._transaction() as db:
            db.executemany(
                "UPDATE batches SET delivered = ? WHERE step = ?",
                [(int(delivered), step) for step in steps],
            )
            self._write_state(db, state)

    def release_batches(self, batches: Sequence[BatchRecord], state: dict[str, Any]) -> None:
        with self._transaction() as db:
            keys = [(key,) for batch in batches for key in batch.keys]
            db.executemany("DELETE FROM groups WHERE key = ?", keys)
            db.executemany("DELETE FROM batches WHERE step = ?", [(b.step,) for b in batches])
            self._write_state(db, state)

    def save_state(self, state: dict[str, Any]) -> None:
        with self._transaction() as db:
            self._write_state(db, state)

    def reset(self) -> None:
        with self._transaction() as db:
            for table in ("groups", "batches", "group_ids", "state"):
                db.execute(f"DELETE FROM {table}")

    def close(self) -> None:
        self._checkpointer.stop()
        self._db.close()
        self._lock.close()
