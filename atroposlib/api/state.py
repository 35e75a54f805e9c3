"""The broker's persistent state: what survives a restart beside the queued groups.

The store keeps it as one JSON document (``to_stored``); the broker changes it only through
a copy that replaces it once the store has written the copy (see ``Broker._transaction``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class BrokerState:
    trainer: dict[str, Any] | None = None
    """The owning trainer's registration (``TrainerRegistration.model_dump()``)."""
    trainer_uuid: int | None = None
    started: bool = False
    """The trainer asked for its first batch: environments may register from then on."""
    current_step: int = 0
    acked_step: int | None = None
    envs: list[dict[str, Any]] = field(default_factory=list)
    fair_share: dict[str, Any] = field(default_factory=dict)
    next_key: int = 1
    counters: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_stored(cls, stored: Mapping[str, Any]) -> BrokerState:
        """The state a store saved (missing keys take their defaults, unknown ones are
        logged and ignored: a newer broker's state read by an older one)."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(stored) - names)
        if unknown:
            logger.warning("ignoring unknown broker state keys %s", unknown)
        return cls(**{name: value for name, value in stored.items() if name in names})

    def to_stored(self) -> dict[str, Any]:
        return {
            "trainer": self.trainer,
            "trainer_uuid": self.trainer_uuid,
            "started": self.started,
            "current_step": self.current_step,
            "acked_step": self.acked_step,
            "envs": self.envs,
            "fair_share": self.fair_share,
            "next_key": self.next_key,
            "counters": self.counters,
        }

    def draft(self) -> BrokerState:
        """A copy to change: its containers are new, so the original stays as it was."""
        return BrokerState(  # spelled out: dataclasses.replace costs ~3x on every ingest
            self.trainer, self.trainer_uuid, self.started, self.current_step, self.acked_step,
            list(self.envs), dict(self.fair_share), self.next_key, dict(self.counters),
        )  # fmt: skip

    def count(self, name: str, amount: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + amount
