"""The broker state machine as plain calls: batches, acks, re-delivery, staleness, restarts."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from broker_testlib import env_body, make_group, markers, trainer_body

from atroposlib.api.broker import Broker
from atroposlib.api.settings import BrokerSettings
from atroposlib.api.store import GroupStore, MemoryStore, SqliteStore
from atroposlib.errors import (
    ConfigError,
    InvalidGroupError,
    QueueFullError,
    RetryLaterError,
    StoreWriteError,
)
from atroposlib.wire.broker import EnvRegistration, TrainerRegistration


def trainer(**overrides: Any) -> TrainerRegistration:
    return TrainerRegistration.model_validate(trainer_body(**overrides))


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GroupStore]:
    opened = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "b.sqlite3")
    yield opened
    opened.close()


def make_broker(store: GroupStore, **settings: Any) -> Broker:
    return Broker(store, BrokerSettings(store="memory", **settings))


def batch_markers(broker: Broker) -> tuple[int, list[int]] | None:
    formed = broker.next_batch()
    if formed is None:
        return None
    step, groups = formed
    return step, markers(groups)


def test_groups_before_registration_are_kept_and_checked_at_registration(
    store: GroupStore,
) -> None:
    broker = make_broker(store)
    broker.ingest([make_group(2, marker=10), make_group(8, marker=20), make_group(1, length=40)])
    broker.ingest([make_group(2, marker=30)])
    broker.register_trainer(trainer(batch_size=4, max_token_len=32))
    assert broker.counters["dropped_group_too_large"] == 1
    assert broker.counters["dropped_too_long"] == 1
    assert batch_markers(broker) == (1, [10, 11, 30, 31])


def test_steps_count_from_starting_step_and_oldest_first(store: GroupStore) -> None:
    broker = make_broker(store)
    broker.register_trainer(trainer(batch_size=2, starting_step=10))
    broker.ingest([make_group(2, marker=m) for m in (100, 200, 300)])
    assert batch_markers(broker) == (11, [100, 101])
    assert batch_markers(broker) == (12, [200, 201])
    assert broker.status().current_step == 12
    assert batch_markers(broker) == (13, [300, 301])
    assert broker.next_batch() is None


def test_reregister_redelivers_unacked_batches_in_order(store: GroupStore) -> None:
    broker = make_broker(store)
    broker.register_trainer(trainer(batch_size=3, acknowledges=True))
    broker.ingest([make_group(1, marker=m) for m in range(100, 115)])
    delivered = [batch_markers(broker) for _ in range(4)]
    broker.ack(1)
    broker.register_trainer(trainer(batch_size=3, acknowledges=True, starting_step=2))
    assert broker.status().current_step == 2
    assert [batch_markers(broker) for _ in range(2)] == delivered[2:]
    assert batch_markers(broker) == (5, [112, 113, 114])
    broker.ack(5)
    broker.register_trainer(trainer(batch_size=3, acknowledges=True, starting_step=5))
    assert broker.next_batch() is None


def test_trainer_that_never_acks_keeps_only_recent_batches(store: GroupStore) -> None:
    broker = make_broker(store, retain_delivered_batches=2)
    broker.register_trainer(trainer(batch_size=1))
    broker.ingest([make_group(1, marker=m) for m in range(5)])
    delivered = [batch_markers(broker) for _ in range(4)]
    broker.register_trainer(trainer(batch_size=1, starting_step=1))
    assert [batch_markers(broker) for _ in range(2)] == delivered[2:]
    assert batch_markers(broker) == (5, [4])


def test_stale_groups_are_dropped_and_counted(store: GroupStore) -> None:
    broker = make_broker(store)
    broker.register_trainer(trainer(batch_size=1, max_staleness=1, starting_step=3))
    broker.ingest(
        [
            make_group(1, marker=1, policy_version=1),
            make_group(1, marker=2, policy_version=2),
            make_group(1, marker=3),
        ]
    )
    assert batch_markers(broker) == (4, [2])
    assert broker.counters["dropped_stale"] == 1
    assert batch_markers(broker) == (5, [3])


def test_staleness_is_judged_on_the_oldest_sampled_token(store: GroupStore) -> None:
    broker = make_broker(store)
    broker.register_trainer(trainer(batch_size=1, max_staleness=1, starting_step=3))
    # marker 1: its last token came from version 3, its first ones from version 1
    broker.ingest(
        [
            make_group(1, marker=1, policy_version=3, token_policy_versions=[[-1, 1, 1, 3]]),
            make_group(1, marker=5, policy_versions=[1]),
            make_group(1, marker=7, token_policy_versions=[[-1, 2, 2, 3]]),
        ]
    )
    assert batch_markers(broker) == (4, [7])
    assert broker.counters["dropped_stale"] == 2


def test_stale_policy_reject_refuses_a_group_already_too_old(store: GroupStore) -> None:
    broker = make_broker(store, stale_policy="reject")
    broker.register_trainer(trainer(batch_size=1, max_staleness=1, starting_step=3))
    with pytest.raises(InvalidGroupError) as refused:
        broker.ingest([make_group(1, marker=1, token_policy_versions=[[-1, 1, 2, 3]])])
    assert refused.value.field == "policy_versions"
    assert "max_staleness 1" in refused.value.message
    assert broker.ingest([make_group(1, marker=2, policy_versions=[2])]).accepted == 1


def test_everything_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "broker.sqlite3"
    first = make_broker(SqliteStore(path))
    first.register_trainer(trainer(batch_size=2, acknowledges=True, starting_step=7))
    first.next_batch()
    env = first.register_env(EnvRegistration.model_validate(env_body(min_batch_allocation=0.5)))
    assert getattr(env, "env_id", None) == 0
    first.ingest([make_group(2, marker=m, env_id=0, group_id=str(m)) for m in (10, 20, 30)])
    assert batch_markers(first) == (8, [10, 11])
    first.store.close()

    second = make_broker(SqliteStore(path))
    assert second.status().model_dump() == {"current_step": 8, "queue_size": 2}
    assert second.latest_example()["tokens"][0][0] == 30
    assert second.info().batch_size == 2
    assert second.ingest([make_group(2, group_id="20")]).duplicates == 1
    assert second.ingest([make_group(2, group_id="10")]).duplicates == 1
    assert second.status_env(0).unallocated_fraction == 0.5
    second.register_trainer(trainer(batch_size=2, acknowledges=True, starting_step=7))
    assert batch_markers(second) == (8, [10, 11])
    assert batch_markers(second) == (9, [20, 21])
    second_env = second.register_env(EnvRegistration.model_validate(env_body()))
    assert getattr(second_env, "wandb_name", None) == "gsm8k_1"
    second.store.close()


def test_reset_forgets_everything(store: GroupStore) -> None:
    broker = make_broker(store)
    broker.register_trainer(trainer())
    broker.ingest([make_group(group_id="a")])
    broker.reset()
    assert broker.trainer is None and broker.status().queue_size == 0
    assert broker.ingest([make_group(group_id="a")]).duplicates == 0


def test_one_broker_per_sqlite_store(tmp_path: Path) -> None:
    first = SqliteStore(tmp_path / "broker.sqlite3")
    with pytest.raises(ConfigError, match="another broker"):
        SqliteStore(tmp_path / "broker.sqlite3")
    first.close()
    SqliteStore(tmp_path / "broker.sqlite3").close()


def test_recent_groups_are_bounded_by_count_and_bytes(
    store: GroupStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = make_broker(store, recent_groups_kept=3)
    broker.ingest([make_group(1, marker=m) for m in range(5)])
    assert markers(broker.recent_groups(10)) == [2, 3, 4]
    monkeypatch.setattr("atroposlib.api.broker.RECENT_BYTES", 1)
    broker.ingest([make_group(1, marker=9)])
    assert markers(broker.recent_groups(10)) == [9]
    assert markers([broker.latest_example()]) == [9]


def test_a_second_consumer_with_another_identity_does_not_rewind_the_trainer(
    store: GroupStore,
) -> None:
    broker = make_broker(store)
    broker.register_trainer(trainer(batch_size=2, starting_step=0, checkpoint_dir="run/ckpt"))
    broker.ingest([make_group(2, marker=m) for m in (10, 20, 30)])
    assert batch_markers(broker) == (1, [10, 11])
    assert batch_markers(broker) == (2, [20, 21])

    observer = trainer(batch_size=8, starting_step=0, checkpoint_dir="sft-export", wandb_group="x")
    broker.register_trainer(observer)
    assert broker.current_step == 2
    assert broker.info().batch_size == 2
    assert batch_markers(broker) == (3, [30, 31])

    # the trainer itself resuming from step 1 rewinds: batches 2 and 3 come again, in order
    broker.register_trainer(trainer(batch_size=2, starting_step=1, checkpoint_dir="run/ckpt"))
    assert batch_markers(broker) == (2, [20, 21])
    assert batch_markers(broker) == (3, [30, 31])


def test_batches_never_rewrite_payload_rows_and_release_deletes_them(tmp_path: Path) -> None:
    path = tmp_path / "broker.sqlite3"
    broker = make_broker(SqliteStore(path))
    broker.register_trainer(trainer(batch_size=2, acknowledges=True))
    broker.ingest([make_group(2, marker=m) for m in (10, 20)])
    assert batch_markers(broker) == (1, [10, 11])
    broker.store.close()  # applies the segment log to SQLite
    db = sqlite3.connect(path)
    assert db.execute("SELECT COUNT(*) FROM groups WHERE batch_step IS NOT NULL").fetchone() == (0,)
    db.close()
    broker = make_broker(SqliteStore(path))
    broker.ack(1)
    broker.store.close()
    db = sqlite3.connect(path)
    assert [row[0] for row in db.execute("SELECT key FROM groups")] == [2]
    db.close()
    reopened = make_broker(SqliteStore(path))
    assert reopened.status().queue_size == 1
    reopened.store.close()


def test_a_store_written_with_batch_step_columns_still_loads(tmp_path: Path) -> None:
    """Earlier versions marked batch membership on the group rows; those files keep working."""
    path = tmp_path / "broker.sqlite3"
    broker = make_broker(SqliteStore(path))
    broker.register_trainer(trainer(batch_size=2, acknowledges=True))
    broker.ingest([make_group(2, marker=m) for m in (10, 20)])
    assert batch_markers(broker) == (1, [10, 11])
    broker.store.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE groups SET batch_step = 1 WHERE key = 1")
    db.execute("DELETE FROM batches")  # the old layout: membership only on the row
    db.commit()
    db.close()
    reopened = make_broker(SqliteStore(path))
    assert reopened.status().queue_size == 1  # the batched group is not queued again
    reopened.store.close()


def test_a_store_that_cannot_write_answers_retry_later_and_changes_nothing(
    store: GroupStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = make_broker(store, retry_after_seconds=7)
    broker.ingest([make_group(2, marker=10)])
    counters, status = broker.counters, broker.status()

    def disk_full(*_: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "add_groups", disk_full)
    with pytest.raises(StoreWriteError, match="No space left on device") as refused:
        broker.ingest([make_group(2, marker=20)])
    assert refused.value.retry_after == 7
    assert isinstance(refused.value, RetryLaterError)  # a 503 with Retry-After, as a full queue
    assert not isinstance(refused.value, QueueFullError)  # but the queue is not full
    assert broker.counters == counters and broker.status() == status
    monkeypatch.undo()
    broker.ingest([make_group(2, marker=30)])
    broker.register_trainer(trainer(batch_size=4, acknowledges=True))
    assert batch_markers(broker) == (1, [10, 11, 30, 31])


def test_a_batch_the_store_cannot_record_is_not_formed(
    store: GroupStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = make_broker(store)
    broker.register_trainer(trainer(batch_size=2, acknowledges=True))
    broker.ingest([make_group(2, marker=m, env_id=None) for m in (10, 20)])
    counters, status = broker.counters, broker.status()

    def disk_full(*_: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "save_batch", disk_full)
    with pytest.raises(StoreWriteError, match="cannot store the batch"):
        broker.next_batch()
    assert broker.counters == counters and broker.status() == status
    monkeypatch.undo()
    assert batch_markers(broker) == (1, [10, 11])  # the same groups, in order, step 1
    assert batch_markers(broker) == (2, [20, 21])


def test_registrations_and_acks_the_store_cannot_write_change_nothing(
    store: GroupStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = make_broker(store)
    broker.register_trainer(trainer(batch_size=2, acknowledges=True))
    broker.ingest([make_group(2, marker=10, env_id=None)])
    assert broker.next_batch() is not None
    registration = EnvRegistration.model_validate(env_body())
    counters = broker.counters

    def disk_full(*_: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "save_state", disk_full)
    monkeypatch.setattr(store, "release_batches", disk_full)
    with pytest.raises(StoreWriteError, match="registration"):
        broker.register_env(registration)
    with pytest.raises(StoreWriteError, match="acknowledgement"):
        broker.ack(1)
    with pytest.raises(StoreWriteError, match="registration"):
        broker.register_trainer(trainer(batch_size=4, acknowledges=True, starting_step=1))
    assert broker.counters == counters
    assert broker.trainer is not None and broker.trainer.batch_size == 2
    monkeypatch.undo()
    first = broker.register_env(registration)
    assert getattr(first, "env_id", None) == 0  # the refused registration left no phantom env
    broker.ack(1)
    assert broker.current_step == 1
