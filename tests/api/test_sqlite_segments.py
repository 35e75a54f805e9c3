"""The durable store: payloads in an append-only segment log, applied to SQLite in batches.

``crash`` closes a store the way a kill -9 leaves it: every write it made is in the files (they
were syscalls before the call returned), nothing more is applied or flushed. A real kill -9 of a
broker process is in ``test_integration.py``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from broker_testlib import make_group, markers
from test_broker import batch_markers, make_broker, trainer

from atroposlib.api.store import SqliteStore, open_store
from atroposlib.api.store import sqlite as sqlite_module
from atroposlib.api.store.base import BatchRecord, GroupMeta, NewGroup
from atroposlib.api.store.blob import encode_group
from atroposlib.api.store.seen import RecentIdFilter
from atroposlib.api.store.segments import LogPosition, SegmentLog
from atroposlib.api.validation import check_group


def crash(store: SqliteStore) -> None:
    store._checkpointer.stop()
    store._db.close()
    store._log.close()
    store._lock.close()


def rows(path: Path, query: str) -> list[tuple[Any, ...]]:
    reader = sqlite3.connect(path)
    try:
        return reader.execute(query).fetchall()
    finally:
        reader.close()


def segment_files(store_path: Path) -> list[Path]:
    return sorted(store_path.with_name(store_path.name + "-segments").glob("*.seg"))


def test_accepting_groups_writes_the_segment_log_and_applies_sqlite_in_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "APPLY_EVERY", 4)
    path = tmp_path / "b.sqlite3"
    broker = make_broker(SqliteStore(path))
    for m in (10, 20, 30):
        broker.ingest([make_group(2, marker=m, group_id=f"g{m}")])
    assert rows(path, "SELECT COUNT(*) FROM groups") == [(0,)]  # not applied yet
    assert sum(f.stat().st_size for f in segment_files(path)) > 3 * 2 * 8  # but written
    broker.ingest([make_group(2, marker=40, group_id="g40")])  # the 4th change applies all
    assert rows(path, "SELECT COUNT(*) FROM groups") == [(4,)]
    assert rows(path, "SELECT COUNT(*) FROM group_ids") == [(4,)]
    assert rows(path, "SELECT COUNT(*) FROM groups WHERE payload != x''") == [(0,)]
    broker.store.close()


@pytest.mark.parametrize("stop", ["close", "crash"])
def test_groups_batches_and_acks_survive_a_crash_before_sqlite_saw_them(
    tmp_path: Path, stop: str
) -> None:
    path = tmp_path / "b.sqlite3"
    first = make_broker(SqliteStore(path))
    first.register_trainer(trainer(batch_size=2, acknowledges=True))
    first.ingest([make_group(2, marker=m, group_id=str(m)) for m in (10, 20, 30, 40)])
    assert batch_markers(first) == (1, [10, 11])
    assert batch_markers(first) == (2, [20, 21])
    first.ack(1)
    if stop == "crash":
        crash(first.store)  # type: ignore[arg-type]
        assert rows(path, "SELECT COUNT(*) FROM groups") == [(0,)]  # only the log had them
    else:
        first.store.close()

    second = make_broker(SqliteStore(path))
    assert second.status().model_dump() == {"current_step": 2, "queue_size": 2}
    assert second.counters["groups_in"] == 4
    assert second.ingest([make_group(2, group_id="10")]).duplicates == 1
    assert second.ingest([make_group(2, group_id="40")]).duplicates == 1
    second.register_trainer(trainer(batch_size=2, acknowledges=True, starting_step=1))
    assert batch_markers(second) == (2, [20, 21])  # unacked step 2 again, acked 1 never
    assert batch_markers(second) == (3, [30, 31])
    assert batch_markers(second) == (4, [40, 41])
    second.store.close()


def test_a_torn_record_is_cut_off_and_later_writes_follow_it(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite3"
    first = make_broker(SqliteStore(path))
    first.ingest([make_group(2, marker=0, group_id="a")])
    (segment,) = segment_files(path)
    intact = segment.stat().st_size
    first.ingest([make_group(2, marker=20, group_id="b")])
    crash(first.store)  # type: ignore[arg-type]
    os.truncate(segment, segment.stat().st_size - 5)  # the second record, half written

    second = make_broker(SqliteStore(path))
    assert second.status().queue_size == 1
    assert second.counters["log_damage"] == 1
    assert segment.read_bytes()[intact : intact + 4] == b"\xa7SGR"  # the next record, not debris
    assert second.ingest([make_group(2, group_id="b")]).accepted == 1  # "b" was never stored
    second.ingest([make_group(2, marker=30, group_id="c")])
    crash(second.store)  # type: ignore[arg-type]

    third = make_broker(SqliteStore(path))
    third.register_trainer(trainer(batch_size=6, acknowledges=True))
    _, groups = third.next_batch() or (0, [])
    assert sorted(markers(groups)) == [0, 1, 30, 31, 1000, 1001]
    third.store.close()


def _flip_byte_inside(path: Path, marker_group: dict[str, Any]) -> None:
    """Damage the stored payload of ``marker_group`` (as a power loss might)."""
    payload = encode_group(check_group(marker_group).group)
    for segment in segment_files(path):
        data = bytearray(segment.read_bytes())
        at = data.find(payload)
        if at >= 0:
            data[at + len(payload) // 2] ^= 0xFF
            segment.write_bytes(bytes(data))
            return
    raise AssertionError("payload not found in any segment")


def test_damaged_payloads_are_dropped_and_counted_never_served(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite3"
    groups = {m: make_group(2, marker=m) for m in (10, 20, 30, 40, 50)}
    first = make_broker(SqliteStore(path))
    first.register_trainer(trainer(batch_size=4, acknowledges=True))
    first.ingest(list(groups.values()))
    assert batch_markers(first) == (1, [10, 11, 20, 21])
    first.store.close()
    _flip_byte_inside(path, groups[20])  # in the unacknowledged batch 1
    _flip_byte_inside(path, groups[40])  # queued

    second = make_broker(SqliteStore(path))
    assert second.counters["dropped_corrupt"] == 3  # 40, and batch 1 whole (10 and 20)
    assert second.status().queue_size == 2
    second.register_trainer(trainer(batch_size=4, acknowledges=True))
    assert batch_markers(second) == (1, [30, 31, 50, 51])  # re-registered at step 0
    second.store.close()
    third = make_broker(SqliteStore(path))  # the drop itself was stored
    assert third.counters["dropped_corrupt"] == 3
    assert third.status().queue_size == 0
    third.store.close()


def test_segments_are_deleted_once_nothing_points_into_them(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite3"
    broker = make_broker(SqliteStore(path, segment_bytes=500))
    broker.register_trainer(trainer(batch_size=2, acknowledges=True))
    for m in range(10, 200, 10):
        broker.ingest([make_group(2, marker=m)])
    assert len(segment_files(path)) >= 10
    step = 0
    while (formed := broker.next_batch()) is not None:
        step = formed[0]
    broker.ack(step)
    broker.store.close()
    assert len(segment_files(path)) == 1  # only the active one is left
    reopened = make_broker(SqliteStore(path, segment_bytes=500))
    assert reopened.status().queue_size == 0
    reopened.store.close()


def test_a_store_that_kept_payloads_inside_sqlite_still_serves_them(tmp_path: Path) -> None:
    """Stores written by earlier versions: payload BLOBs in the groups table, no segments."""
    path = tmp_path / "b.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE groups (key INTEGER PRIMARY KEY, env_id INTEGER, size INTEGER NOT NULL,
            tokens INTEGER NOT NULL, max_len INTEGER NOT NULL, nbytes INTEGER NOT NULL,
            policy_version INTEGER, batch_step INTEGER, payload BLOB NOT NULL);
        CREATE TABLE state (id INTEGER PRIMARY KEY CHECK (id = 0), body BLOB NOT NULL);
        """
    )
    payload = encode_group(check_group(make_group(2, marker=10)).group)
    db.execute(
        "INSERT INTO groups VALUES (1, NULL, 2, 8, 4, ?, NULL, NULL, ?)", (len(payload), payload)
    )
    db.execute("INSERT INTO state VALUES (0, ?)", (b'{"next_key": 2}',))
    db.commit()
    db.close()
    broker = make_broker(SqliteStore(path))
    broker.ingest([make_group(2, marker=20)])
    broker.register_trainer(trainer(batch_size=4, acknowledges=True))
    assert batch_markers(broker) == (1, [10, 11, 20, 21])
    broker.store.close()


def test_the_background_thread_checkpoints_the_wal(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite3"
    store = SqliteStore(path, sync_interval=0.05)
    broker = make_broker(store)
    long_ids = [f"{n:0>200}" for n in range(12_000)]  # ~2.4 MB of group ids to apply
    for group_id in long_ids:
        broker.ingest([make_group(1, group_id=group_id)])
    deadline = time.monotonic() + 10
    while path.stat().st_size < 2 << 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.stat().st_size >= 2 << 20  # the thread copied the WAL into the database
    store.close()


def test_run_api_opens_the_store_with_its_sync_interval(tmp_path: Path) -> None:
    store = open_store(f"sqlite:{tmp_path / 'b.sqlite3'}", sync_interval=0.2)
    assert isinstance(store, SqliteStore) and store._checkpointer.interval == 0.2
    store.close()


def test_recent_id_filter_never_forgets_the_last_capacity_ids() -> None:
    kept = RecentIdFilter(1_000)
    ids = [f"group-{n}" for n in range(2_500)]
    for group_id in ids:
        kept.add(group_id)
    assert all(kept.may_contain(group_id) for group_id in ids[-1_000:])
    strangers = sum(kept.may_contain(f"other-{n}") for n in range(10_000))
    assert strangers < 500  # about 1-2 % "maybe" at capacity, each settled by a query
    kept.clear()
    assert not any(kept.may_contain(group_id) for group_id in ids)


def test_duplicates_are_found_through_the_filter_before_and_after_sqlite_has_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "APPLY_EVERY", 3)
    path = tmp_path / "b.sqlite3"
    broker = make_broker(SqliteStore(path, group_ids_kept=5))
    for n in range(12):
        broker.ingest([make_group(1, group_id=f"id{n}")])
    assert broker.ingest([make_group(1, group_id="id11")]).duplicates == 1  # pending
    assert broker.ingest([make_group(1, group_id="id7")]).duplicates == 1  # applied
    assert msgpack.packb(broker.counters)  # counters stay plain data
    broker.store.close()


def test_segment_log_rotates_syncs_and_reads_with_few_open_files(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path / "segments", segment_bytes=64)
    payloads = [bytes([n]) * 100 for n in range(100)]
    locations = [log.append({"op": "state", "n": n}, [p])[0] for n, p in enumerate(payloads)]
    assert len(log.segments()) == 100  # every record starts a new (tiny) segment
    log.sync()  # fdatasyncs each written segment, from any thread
    assert [log.read(loc) for loc in locations] == payloads
    assert len(os.listdir("/proc/self/fd")) < 100  # readers are closed past a bound
    log.delete(locations[0].segment)
    with pytest.raises(ValueError, match="active"):
        log.delete(log.active_segment)
    replayed = list(log.replay(LogPosition(locations[1].segment, 0)))
    assert [r.header["n"] for r in replayed] == list(range(1, 100))
    log.close()


def test_a_long_waiting_group_is_moved_out_of_its_segment_and_survives_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "APPLY_EVERY", 4)
    path = tmp_path / "b.sqlite3"
    store = SqliteStore(path, segment_bytes=4_000)
    broker = make_broker(store)
    broker.register_trainer(trainer(batch_size=2, acknowledges=True, max_staleness=None))
    broker.ingest([make_group(1, marker=5, env_id=None)])  # a 1-sequence group: waits
    for n in range(1, 60):
        broker.ingest([make_group(2, marker=100 * n)])
        step, _ = broker.next_batch() or (0, [])
        broker.ack(step)
    first_segment = min(int(p.stem) for p in segment_files(path))
    assert first_segment > 1  # the waiting group's payload was copied forward, its segment freed
    assert len(segment_files(path)) < 12
    assert store.payloads([1]) == [encode_group(check_group(make_group(1, marker=5)).group)]
    crash(store)

    reopened = make_broker(SqliteStore(path, segment_bytes=4_000))
    assert reopened.status().queue_size == 1
    reopened.ingest([make_group(1, marker=6)])
    reopened.register_trainer(trainer(batch_size=2, acknowledges=True, starting_step=59))
    assert batch_markers(reopened) == (60, [5, 6])
    reopened.store.close()


def test_a_record_of_more_payloads_than_one_writev_takes(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path / "segments")
    payloads = [n.to_bytes(4, "little") * (n % 7) for n in range(3_000)]  # IOV_MAX is 1024
    locations = log.append({"op": "add"}, payloads)
    assert [log.read(loc) for loc in locations] == payloads
    (record,) = log.replay(LogPosition(log.active_segment, 0))
    assert record.payloads == locations
    log.close()


def test_a_list_post_of_thousands_of_groups_is_stored_in_one_record(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite3"
    broker = make_broker(SqliteStore(path), max_queued_groups=5_000)
    assert broker.ingest([make_group(1, marker=m) for m in range(2_000)]).accepted == 2_000
    crash(broker.store)  # type: ignore[arg-type]
    reopened = make_broker(SqliteStore(path), max_queued_groups=5_000)
    assert reopened.status().queue_size == 2_000
    reopened.store.close()


def test_a_failed_write_leaves_no_torn_record_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = SegmentLog(tmp_path / "segments")
    first = log.append({"op": "state", "n": 1}, [b"a" * 100])
    real_writev = os.writev
    calls = 0

    def disk_full_on_second_call(fd: int, buffers: list[bytes]) -> int:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError(28, "No space left on device")
        return real_writev(fd, buffers[:1])  # short writes: one buffer at a time

    monkeypatch.setattr(os, "writev", disk_full_on_second_call)
    with pytest.raises(OSError, match="No space"):
        log.append({"op": "state", "n": 2}, [b"b" * 100, b"c" * 100])
    monkeypatch.setattr(os, "writev", real_writev)
    third = log.append({"op": "state", "n": 3}, [b"d" * 100])
    replayed = list(log.replay(LogPosition(log.active_segment, 0)))
    assert [r.header["n"] for r in replayed] == [1, 3]
    assert log.read(first[0]) == b"a" * 100 and log.read(third[0]) == b"d" * 100
    log.close()


def test_replaying_a_release_never_deletes_a_segment_that_older_groups_still_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group 1 is applied to SQLite; group 2, in the same segment, is added and released only in
    the log. Replaying the release empties the segment of what the replay knows: the older group
    must keep it."""
    monkeypatch.setattr(sqlite_module, "APPLY_EVERY", 3)
    path = tmp_path / "b.sqlite3"
    store = SqliteStore(path, segment_bytes=1_000)
    blob = bytes(range(256)) * 2

    def group(key: int) -> NewGroup:
        return NewGroup(GroupMeta(key, None, 1, 1, 1, len(blob)), blob)

    store.add_groups([group(1)], {"next_key": 2})
    store.save_state({"next_key": 2})
    store.save_state({"next_key": 2})  # the 3rd change: group 1 is applied
    store.add_groups([group(2)], {"next_key": 3})  # same segment, only in the log
    store.release_batches([BatchRecord(1, (2,))], {"next_key": 3})  # starts segment 2
    assert len(segment_files(path)) == 2
    crash(store)

    reopened = SqliteStore(path, segment_bytes=1_000)
    snapshot = reopened.load()
    assert [meta.key for meta in snapshot.queued] == [1]
    assert snapshot.corrupt == set()
    assert reopened.payloads([1]) == [blob]
    reopened.close()
