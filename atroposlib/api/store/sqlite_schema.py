"""The durable store's SQLite side: its schema, the connection's settings and the statements."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from atroposlib.api.store.segments import PayloadLocation

SCHEMA = """
CREATE TABLE IF NOT EXISTS groups (
    key INTEGER PRIMARY KEY, env_id INTEGER, size INTEGER NOT NULL, tokens INTEGER NOT NULL,
    max_len INTEGER NOT NULL, nbytes INTEGER NOT NULL, policy_version INTEGER,
    batch_step INTEGER, payload BLOB NOT NULL,
    segment INTEGER, offset INTEGER, crc INTEGER);
CREATE TABLE IF NOT EXISTS batches (
    step INTEGER PRIMARY KEY, keys BLOB NOT NULL, delivered INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS group_ids (seq INTEGER PRIMARY KEY, group_id TEXT UNIQUE NOT NULL);
CREATE TABLE IF NOT EXISTS state (id INTEGER PRIMARY KEY CHECK (id = 0), body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS log_position (
    id INTEGER PRIMARY KEY CHECK (id = 0), segment INTEGER NOT NULL, offset INTEGER NOT NULL);
"""
LOCATION_COLUMNS = ("segment", "offset", "crc")  # absent from files of earlier versions


def connect(path: Path) -> sqlite3.Connection:
    """The store's database in WAL mode (checkpointed by the store's thread), schema applied."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.executescript(SCHEMA)
    columns = {row[1] for row in db.execute("PRAGMA table_info(groups)")}
    for column in LOCATION_COLUMNS:
        if column not in columns:
            db.execute(f"ALTER TABLE groups ADD COLUMN {column} INTEGER")
    return db


INSERT_GROUP = (
    "INSERT INTO groups (key, env_id, size, tokens, max_len, nbytes, policy_version, payload,"
    " segment, offset, crc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_BATCH = "INSERT OR REPLACE INTO batches (step, keys, delivered) VALUES (?, ?, ?)"
SET_DELIVERED = "UPDATE batches SET delivered = ? WHERE step = ?"
DELETE_BATCH = "DELETE FROM batches WHERE step = ?"
DELETE_GROUP = "DELETE FROM groups WHERE key = ?"
MOVE_GROUP = "UPDATE groups SET segment = ?, offset = ?, crc = ? WHERE key = ?"
GroupRow = tuple[int, int | None, int, int, int, int, int | None, bytes, int, int, int]


def group_row(meta: list[Any], location: PayloadLocation, crc: int) -> GroupRow:
    key, env_id, size, tokens, max_len, nbytes, policy_version = meta
    return (
        key, env_id, size, tokens, max_len, nbytes, policy_version, b"",
        location.segment, location.offset, crc,
    )  # fmt: skip
