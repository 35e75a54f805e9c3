"""A store that keeps everything in this process; lost on exit. For tests and throwaway runs."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import Any

import orjson

from atroposlib.api.store.base import (
    DEFAULT_GROUP_IDS_KEPT,
    BatchRecord,
    GroupMeta,
    GroupStore,
    NewGroup,
    StoreSnapshot,
)

logger = logging.getLogger(__name__)


class MemoryStore(GroupStore):
    description = "memory"

    def __init__(self, *, group_ids_kept: int = DEFAULT_GROUP_IDS_KEPT) -> None:
        self._group_ids_kept = group_ids_kept
        self._group_ids: OrderedDict[str, None] = OrderedDict()
        self._blobs: dict[int, bytes] = {}
        self._metas: dict[int, GroupMeta] = {}
        self._batches: dict[int, BatchRecord] = {}
        self._state = b"{}"  # JSON, as the SQLite store keeps it: a snapshot, cheap to take

    def load(self) -> StoreSnapshot:
        in_batches = {key for batch in self._batches.values() for key in batch.keys}
        return StoreSnapshot(
            state=orjson.loads(self._state),
            queued=[m for k, m in sorted(self._metas.items()) if k not in in_batches],
            batched={k: self._metas[k] for k in in_batches},
            batches=[
                BatchRecord(b.step, b.keys, b.delivered) for _, b in sorted(self._batches.items())
            ],
        )

    def add_groups(self, groups: Sequence[NewGroup], state: dict[str, Any]) -> None:
        for group in groups:
            self._blobs[group.meta.key] = group.blob
            self._metas[group.meta.key] = group.meta
            if group.group_id is not None:
                self._group_ids[group.group_id] = None
        while len(self._group_ids) > self._group_ids_kept:
            self._group_ids.popitem(last=False)
        self.save_state(state)

    def seen_group_ids(self, group_ids: Collection[str]) -> set[str]:
        return {gid for gid in group_ids if gid in self._group_ids}

    def payloads(self, keys: Sequence[int]) -> list[bytes]:
        return [self._blobs[key] for key in keys]

    def drop_groups(self, keys: Collection[int], state: dict[str, Any]) -> None:
        for key in keys:
            self._blobs.pop(key, None)
            self._metas.pop(key, None)
        self.save_state(state)

    def save_batch(self, batch: BatchRecord, state: dict[str, Any]) -> None:
        self._batches[batch.step] = BatchRecord(batch.step, batch.keys, batch.delivered)
        self.save_state(state)

    def set_delivered(self, steps: Collection[int], delivered: bool, state: dict[str, Any]) -> None:
        for step in steps:
            self._batches[step].delivered = delivered
        self.save_state(state)

    def release_batches(self, batches: Sequence[BatchRecord], state: dict[str, Any]) -> None:
        for batch in batches:
            self._batches.pop(batch.step, None)
            self.drop_groups(batch.keys, state)
        self.save_state(state)

    def save_state(self, state: dict[str, Any]) -> None:
        self._state = orjson.dumps(state)

    def reset(self) -> None:
        self._group_ids.clear()
        self._blobs.clear()
        self._metas.clear()
        self._batches.clear()
        self._state = b"{}"
