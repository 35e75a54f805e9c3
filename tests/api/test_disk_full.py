"""A broker whose disk fills: 503 + Retry-After, acks still free space, nothing queued is lost.

The store lies on a real 16 MiB filesystem (see ``disk_testlib``); the broker is a real
process, killed with -9 while the disk is full and started again on it.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from broker_testlib import BrokerProcess, make_group, markers, trainer_body
from disk_testlib import MiB, small_disk
from test_broker import make_broker, trainer
from test_sqlite_segments import crash

from atroposlib.api.store import SqliteStore
from atroposlib.api.store import sqlite as sqlite_module

GROUP_TOKENS = 3000  # a group of 2 sequences: ~20 KB stored


HTTP = httpx.Client(timeout=30)  # one client: making one per request costs ~40 ms


def _post(url: str, mark: int) -> httpx.Response:
    group = make_group(2, length=GROUP_TOKENS, marker=10 * mark, group_id=f"g{mark}")
    return HTTP.post(f"{url}/scored_data", json=group)


def _take_all(url: str, last: int) -> tuple[int, list[int]]:
    """Pull and acknowledge every batch the broker can form; the last step and the markers."""
    got: list[int] = []
    while True:
        answer = HTTP.get(f"{url}/batch", params={"received": last})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        if body["batch"] is None:
            return last, got
        last = body["step"]
        got += markers(body["batch"])[::2]
        ack = HTTP.post(f"{url}/ack", json={"step": last})
        assert ack.status_code == 200, ack.text


@pytest.mark.slow
def test_a_full_disk_refuses_new_groups_frees_space_on_acks_and_loses_nothing(
    tmp_path: Path,
) -> None:
    with small_disk(tmp_path, 16 * MiB) as disk:
        store = f"sqlite:{disk.folder / 'broker.sqlite3'}"
        floor = 2 * MiB + disk.extra_floor
        broker = BrokerProcess(
            store, "--min-free-bytes", str(floor), "--segment-bytes", str(256 * 1024),
            "--retry-after-seconds", "3",
        ).start()  # fmt: skip
        try:
            body = trainer_body(batch_size=4, max_token_len=GROUP_TOKENS, acknowledges=True)
            assert httpx.post(f"{broker.url}/register", json=body).is_success
            accepted, refused, mark = [], None, 0
            while refused is None:  # the floor: new groups are refused, the broker answers
                answer = _post(broker.url, mark)
                if answer.status_code == 200:
                    accepted.append(mark)
                else:
                    refused = answer
                mark += 1
            assert refused.status_code == 503 and refused.headers["retry-after"] == "3"
            assert "disk" in refused.json()["detail"], refused.text
            assert len(accepted) > 100

            disk.fill()  # someone else takes the rest: nothing at all is free
            assert _post(broker.url, mark).status_code == 503
            free_before = disk.free()
            last, delivered = _take_all(broker.url, 0)  # acks go through on a full disk
            assert len(delivered) >= len(accepted) - 1
            assert disk.free() - free_before > 2 * MiB, "acknowledged groups freed no space"

            broker.kill9()  # on a disk that is still nearly full
            broker.start()
            disk.drain()
            for extra in range(mark, mark + 20):
                assert _post(broker.url, extra).status_code == 200
                accepted.append(extra)
            last, more = _take_all(broker.url, last)
            delivered += more
            leftover = httpx.get(f"{broker.url}/status").json()["queue_size"]
            assert sorted(delivered) == [10 * m for m in accepted][: len(delivered)]
            assert len(delivered) + leftover == len(accepted) and leftover <= 1
        finally:
            broker.stop()


def test_a_store_reopened_on_a_short_disk_never_deletes_a_segment_it_has_not_indexed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At start the index knows only the replayed groups: nothing may be rotated away then."""
    monkeypatch.setattr(sqlite_module, "APPLY_EVERY", 8)
    path = tmp_path / "b.sqlite3"
    first = make_broker(SqliteStore(path, min_free_bytes=0, segment_bytes=64 * 1024))
    for mark in range(16):  # applied to SQLite (twice 8): the groups of the active segment
        first.ingest([make_group(1, marker=10 * mark, group_id=f"g{mark}")])
    first.register_trainer(trainer(batch_size=1, acknowledges=True))  # logged only
    crash(first.store)  # type: ignore[arg-type]
    short = SqliteStore(path, min_free_bytes=2**60, segment_bytes=64 * 1024)  # always short
    second = make_broker(short)
    assert "dropped_corrupt" not in second.counters
    got = []
    while (formed := second.next_batch()) is not None:
        got += markers(formed[1])
    assert got == [10 * mark for mark in range(16)]
    second.store.close()
