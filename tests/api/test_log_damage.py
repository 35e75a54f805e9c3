"""Damage in the durable store's log costs the damaged record only, and never stops a start.

``crash`` leaves a store as a kill -9 does: its changes are in the segment log only (fewer than
``APPLY_EVERY``), so opening it again replays the log, damage included. A real broker process
killed and restarted on a damaged log is at the end.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from broker_testlib import BrokerProcess, make_group, markers, trainer_body
from test_broker import make_broker, trainer
from test_sqlite_segments import crash, segment_files

from atroposlib.api.broker import Broker
from atroposlib.api.store import SqliteStore

MAGIC = b"\xa7SGR"


def _record_starts(segment: Path) -> list[int]:
    data, starts, at = segment.read_bytes(), [], 0
    while (at := data.find(MAGIC, at)) != -1:
        starts.append(at)
        at += 1
    return starts


def _filled(path: Path, count: int) -> None:
    broker = make_broker(SqliteStore(path))
    for mark in range(count):
        broker.ingest([make_group(1, marker=100 * mark, group_id=f"g{mark}")])
    crash(broker.store)  # type: ignore[arg-type]


def _all_markers(broker: Broker) -> list[int]:
    broker.register_trainer(trainer(batch_size=1, acknowledges=True))
    out = []
    while (formed := broker.next_batch()) is not None:
        out += markers(formed[1])
    return out


def _edit(segment: Path, at: int, new: bytes) -> None:
    data = bytearray(segment.read_bytes())
    data[at : at + len(new)] = new
    segment.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["magic", "length", "crc", "header", "payload"])
@pytest.mark.parametrize("record", [0, 6, 11])  # record k holds group k
def test_one_damaged_record_costs_that_record_only(tmp_path: Path, where: str, record: int) -> None:
    path = tmp_path / "b.sqlite3"
    _filled(path, 12)
    (segment,) = segment_files(path)
    starts = _record_starts(segment)
    offset = {"magic": 1, "length": 5, "crc": 9, "header": 16, "payload": -3}[where]
    end = starts[record + 1] if record + 1 < len(starts) else segment.stat().st_size
    at = starts[record] + offset if offset > 0 else end + offset
    _edit(segment, at, bytes([segment.read_bytes()[at] ^ 0x5A]))

    broker = make_broker(SqliteStore(path))
    assert _all_markers(broker) == [100 * m for m in range(12) if m != record]
    counters = broker.counters
    if where == "payload":  # the header is intact: the group is known, and dropped as damaged
        assert counters["dropped_corrupt"] == 1 and "log_damage" not in counters
    else:
        assert counters["log_damage"] == 1
    broker.store.close()


@pytest.mark.parametrize("tail", [b"\0" * 4096, b"\0" * 3, MAGIC + b"\0" * 20, b"\xff" * 100])
def test_a_torn_or_zero_filled_tail_is_cut_and_later_writes_follow(
    tmp_path: Path, tail: bytes
) -> None:
    path = tmp_path / "b.sqlite3"
    _filled(path, 5)
    (segment,) = segment_files(path)
    intact = segment.stat().st_size
    with segment.open("ab") as handle:
        handle.write(tail)  # a power loss leaves zeroed blocks or half a record
    second = make_broker(SqliteStore(path))
    assert second.status().queue_size == 5 and second.counters["log_damage"] == 1
    assert segment.read_bytes()[intact : intact + 4] == MAGIC
    second.ingest([make_group(1, marker=900, group_id="after")])
    crash(second.store)  # type: ignore[arg-type]
    third = make_broker(SqliteStore(path))
    assert _all_markers(third) == [0, 100, 200, 300, 400, 900]
    assert third.counters["log_damage"] == 1
    third.store.close()


def test_random_damage_never_stops_a_start_nor_serves_a_wrong_group(tmp_path: Path) -> None:
    rng = random.Random(7)
    for trial in range(40):
        path = tmp_path / f"t{trial}" / "b.sqlite3"
        _filled(path, 30)
        (segment,) = segment_files(path)
        data = bytearray(segment.read_bytes())
        for _ in range(rng.randint(1, 6)):
            kind, at = rng.choice(["flip", "zero", "cut", "junk"]), rng.randrange(len(data))
            if kind == "flip":
                data[at] ^= 1 << rng.randrange(8)
            elif kind == "zero":
                data[at : at + rng.randint(1, 600)] = bytes(len(data[at : at + 600]))[:600]
            elif kind == "cut":
                del data[at:]
                if not data:
                    break
            else:
                data[at:at] = rng.randbytes(rng.randint(1, 64))
        segment.write_bytes(bytes(data))
        broker = make_broker(SqliteStore(path))  # must open
        got = _all_markers(broker)
        assert len(got) == len(set(got)) and set(got) <= {100 * m for m in range(30)}, trial
        broker.ingest([make_group(1, marker=7, group_id="new")])  # and keep working
        broker.store.close()
        reopened = make_broker(SqliteStore(path))
        assert 7 in _all_markers(reopened)
        reopened.store.close()


@pytest.mark.slow
def test_a_broker_killed_and_damaged_restarts_and_reports_the_damage(
    broker_process: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_process()
    assert httpx.post(f"{broker.url}/register", json=trainer_body(batch_size=1)).is_success
    for mark in range(40):
        group = make_group(1, marker=10 * mark, group_id=f"g{mark}")
        assert httpx.post(f"{broker.url}/scored_data", json=group).is_success
    broker.kill9()
    (segment,) = segment_files(tmp_path / "broker.sqlite3")
    starts = _record_starts(segment)
    _edit(segment, starts[20] + 9, b"\x00\x00")  # one record in the middle (its crc)
    with segment.open("ab") as handle:
        handle.write(b"\0" * 8192)  # and a zero-filled tail
    broker.start()
    assert httpx.get(f"{broker.url}/status").json()["queue_size"] == 39
    metrics = httpx.get(f"{broker.url}/metrics").text
    assert "broker_log_damage_total 2.0" in metrics
    got = []
    while (batch := httpx.get(f"{broker.url}/batch").json())["batch"] is not None:
        got += markers(batch["batch"])
    lost = 10 * 19  # record 0 is the registration, record k + 1 group k
    assert sorted(got) == [10 * m for m in range(40) if 10 * m != lost]
