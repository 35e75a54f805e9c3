"""What the broker needs from a store of queued groups, batches and its own state.

Every mutating call takes the broker's ``state`` (a JSON-able dict: registration, step, envs,
counters, ...) and writes it in the same transaction, so a crash never leaves the two apart.
Payloads are opaque compact blobs (see :mod:`atroposlib.api.store.blob`); per-group metadata is
small and kept in the broker's memory.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_GROUP_IDS_KEPT = 1_000_000


@dataclass(frozen=True, slots=True)
class GroupMeta:
    """What the broker keeps in memory for one stored group."""

    key: int
    env_id: int | None
    size: int
    tokens: int
    max_len: int
    nbytes: int
    policy_version: int | None = None


@dataclass(frozen=True, slots=True)
class NewGroup:
    meta: GroupMeta
    blob: bytes
    group_id: str | None = None


@dataclass(slots=True)
class BatchRecord:
    """A formed batch: the trainer step it is for and its groups, in order."""

    step: int
    keys: tuple[int, ...]
    delivered: bool = False


@dataclass
class StoreSnapshot:
    state: dict[str, Any] = field(default_factory=dict)
    queued: list[GroupMeta] = field(default_factory=list)
    batched: dict[int, GroupMeta] = field(default_factory=dict)
    batches: list[BatchRecord] = field(default_factory=list)
    corrupt: set[int] = field(default_factory=set)
    """Keys of stored groups whose payload failed its check (e.g. cut short by a power loss)."""
    log_damage: int = 0
    """Damaged stretches of the store's log skipped or cut off while opening it."""


class GroupStore(ABC):
    """Durable (or not) home of groups, batches and broker state; one writer, no threads."""

    description: str = "store"

    @abstractmethod
    def load(self) -> StoreSnapshot:
        """Everything stored: queued groups by key, batches by step, the last saved state."""

    @abstractmethod
    def add_groups(self, groups: Sequence[NewGroup], state: dict[str, Any]) -> None:
        """Queue groups (and remember their group ids) atomically."""

    @abstractmethod
    def seen_group_ids(self, group_ids: Collection[str]) -> set[str]:
        """The subset of ``group_ids`` already stored (queued, delivered or released)."""

    @abstractmethod
    def payloads(self, keys: Sequence[int]) -> list[bytes]:
        """Blobs of the given groups, in the given order."""

    @abstractmethod
    def drop_groups(self, keys: Collection[int], state: dict[str, Any]) -> None:
        """Delete queued groups (stale, too long, ...); their group ids stay remembered."""

    @abstractmethod
    def save_batch(self, batch: BatchRecord, state: dict[str, Any]) -> None:
        """Record a formed batch; its groups leave the queue."""

    @abstractmethod
    def set_delivered(self, steps: Collection[int], delivered: bool, state: dict[str, Any]) -> None:
        """Mark batches as handed out (or due for re-delivery)."""

    @abstractmethod
    def release_batches(self, batches: Sequence[BatchRecord], state: dict[str, Any]) -> None:
        """Forget these batches and delete their groups."""

    @abstractmethod
    def save_state(self, state: dict[str, Any]) -> None:
        """Persist the broker state alone."""

    @abstractmethod
    def reset(self) -> None:
        """Delete everything, group ids included."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files and connections."""
