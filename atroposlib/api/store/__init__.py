"""Stores of queued groups: :class:`MemoryStore` and the durable :class:`SqliteStore`."""

from atroposlib.api.store.base import BatchRecord, GroupMeta, GroupStore, NewGroup, StoreSnapshot
from atroposlib.api.store.memory import MemoryStore
from atroposlib.api.store.segments import SEGMENT_BYTES
from atroposlib.api.store.sqlite import MIN_FREE_BYTES, SYNC_INTERVAL_S, SqliteStore


def open_store(
    spec: str,
    *,
    sync_interval: float = SYNC_INTERVAL_S,
    min_free_bytes: int = MIN_FREE_BYTES,
    segment_bytes: int = SEGMENT_BYTES,
) -> GroupStore:
    """``"memory"`` or ``"sqlite:<path>"`` (as in ``BrokerSettings.store``)."""
    if spec == "memory":
        return MemoryStore()
    if spec.startswith("sqlite:"):
        return SqliteStore(
            spec.removeprefix("sqlite:"), sync_interval=sync_interval,
            min_free_bytes=min_free_bytes, segment_bytes=segment_bytes,
        )  # fmt: skip
    raise ValueError(f"unknown store {spec!r}; use 'memory' or 'sqlite:<path>'")


__all__ = [
    "BatchRecord",
    "GroupMeta",
    "GroupStore",
    "MemoryStore",
    "NewGroup",
    "SqliteStore",
    "StoreSnapshot",
    "open_store",
]
