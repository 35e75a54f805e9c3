"""The registry of environments: ids, wandb names, shares, and their ``/status-env`` numbers."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from atroposlib.api.batching import EnvShare
from atroposlib.errors import UnknownEnvError
from atroposlib.wire.broker import EnvRegistration, EnvStatusResponse

logger = logging.getLogger(__name__)

MIN_ENV_WEIGHT = 0.01
"""Floor of ``env_weight`` so that no env is starved of inference entirely."""


@dataclass(slots=True)
class EnvRecord:
    env_id: int
    desired_name: str
    wandb_name: str
    max_token_length: int
    weight: float
    group_size: int
    min_batch_allocation: float | None
    connected: bool = True


class EnvRegistry:
    """Envs by id (0, 1, 2, ... never reused); ``wandb_name`` is ``<desired_name>_<k>``."""

    def __init__(self, saved: list[dict[str, Any]] | None = None) -> None:
        self._envs = [EnvRecord(**env) for env in saved or ()]

    def to_state(self) -> list[dict[str, Any]]:
        return [asdict(env) for env in self._envs]

    def get(self, env_id: int) -> EnvRecord:
        if not 0 <= env_id < len(self._envs):
            raise UnknownEnvError(env_id)
        return self._envs[env_id]

    def register(self, registration: EnvRegistration) -> EnvRecord:
        same_name = sum(env.desired_name == registration.desired_name for env in self._envs)
        env = EnvRecord(
            env_id=len(self._envs),
            desired_name=registration.desired_name,
            wandb_name=f"{registration.desired_name}_{same_name}",
            max_token_length=registration.max_token_length,
            weight=registration.weight,
            group_size=registration.group_size,
            min_batch_allocation=registration.min_batch_allocation,
        )
        self._envs.append(env)
        logger.info("env %d registered as %s", env.env_id, env.wandb_name)
        return env

    def disconnect(self, env_id: int) -> None:
        self.get(env_id).connected = False

    def shares(self) -> dict[int | None, EnvShare]:
        """Packing shares: every env's weight; minimum allocations only while connected."""
        return {
            env.env_id: EnvShare(
                weight=env.weight,
                min_allocation=env.min_batch_allocation if env.connected else None,
            )
            for env in self._envs
        }

    def status(
        self,
        env_id: int,
        *,
        current_step: int,
        batch_size: int,
        queued_sequences: Mapping[int | None, int],
        max_group_size: int,
    ) -> EnvStatusResponse:
        """Atropos's backpressure numbers; queue sizes count groups of this env's size."""
        env = self.get(env_id)
        connected = [e for e in self._envs if e.connected]
        total = sum(e.max_token_length * max(0.0, e.weight) for e in connected)
        weight = env.max_token_length * env.weight / total if total > 0 else 1.0
        reserved: dict[int | None, int] = {
            e.env_id: int(batch_size * (e.min_batch_allocation or 0.0)) for e in connected
        }
        own = queued_sequences.get(env_id, 0)
        others = sum(
            max(0, sequences - reserved.get(other, 0))
            for other, sequences in queued_sequences.items()
            if other != env_id
        )
        minimums = sum(e.min_batch_allocation or 0.0 for e in connected)
        return EnvStatusResponse(
            current_step=current_step,
            queue_size=(own + others) // env.group_size,
            unallocated_fraction=1.0 - min(1.0, minimums),
            self_queue_size=own // env.group_size,
            max_group_size=max_group_size,
            env_weight=max(MIN_ENV_WEIGHT, weight),
        )
