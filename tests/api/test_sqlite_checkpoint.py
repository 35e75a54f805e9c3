"""The SQLite store checkpoints its WAL in the background, not inside a request's commit."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from atroposlib.api.store.base import GroupMeta, NewGroup
from atroposlib.api.store.sqlite import SqliteStore


def _add(store: SqliteStore, key: int, blob: bytes) -> None:
    meta = GroupMeta(key, 0, 1, len(blob) // 4, len(blob) // 4, len(blob), None)
    store.add_groups([NewGroup(meta, blob, f"g{key}")], {"next_key": key + 1})


def test_wal_is_checkpointed_in_the_background_and_commits_stay_readable(
    tmp_path: Path,
) -> None:
    path = tmp_path / "b.sqlite3"
    store = SqliteStore(path, checkpoint_interval=0.05)
    try:
        blob = os.urandom(64 * 1024)
        for key in range(1, 65):  # 4 MiB: more than 1000 pages, SQLite's auto-checkpoint
            _add(store, key, blob)
        assert path.stat().st_size < 1 << 20  # still in the WAL: commits did not checkpoint
        deadline = time.monotonic() + 10
        while path.stat().st_size < 4 << 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert path.stat().st_size >= 4 << 20  # the background thread copied the WAL over
        reader = sqlite3.connect(path)
        assert reader.execute("SELECT COUNT(*) FROM groups").fetchone() == (64,)
        reader.close()
        assert store.payloads([64]) == [blob]
    finally:
        store.close()
    reopened = SqliteStore(path)
    try:
        assert len(reopened.load().queued) == 64
    finally:
        reopened.close()
