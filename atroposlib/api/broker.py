"""The broker's state machine: registration, ingest, batches, acks, status. No HTTP here.

Every change is written to the store (with the broker state, in one transaction) before the
method returns, so an HTTP layer that answers after the call never acknowledges something a
crash could lose. Methods are synchronous and meant to be called from one thread.
"""

from __future__ import annotations

import logging
import secrets
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from atroposlib.api.packing import EnvShare, FairShareState, QueuedGroupRef, form_batch
from atroposlib.api.settings import BrokerSettings
from atroposlib.api.store import BatchRecord, GroupMeta, GroupStore, NewGroup
from atroposlib.api.store.blob import decode_group, encode_group
from atroposlib.api.validation import CheckedGroup, check_group
from atroposlib.errors import (
    InvalidGroupError,
    QueueFullError,
    TrainerNotRegisteredError,
    UnknownEnvError,
)
from atroposlib.protocol import (
    EnvRegistration,
    EnvRegistrationResponse,
    EnvStatusResponse,
    InfoResponse,
    StatusResponse,
    TrainerRegistration,
    WaitForTrainerResponse,
    WandbInfoResponse,
)

logger = logging.getLogger(__name__)

MIN_ENV_WEIGHT = 0.01
EMPTY_EXAMPLE: dict[str, list[Any]] = {
    name: []
    for name in (
        "tokens", "masks", "scores", "advantages", "ref_logprobs", "generation_params",
        "inference_logprobs", "messages", "images",
    )
}  # fmt: skip


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


@dataclass(frozen=True, slots=True)
class IngestResult:
    accepted: int
    duplicates: int
    dropped: int


def _fresh_state() -> dict[str, Any]:
    return {
        "trainer": None,
        "trainer_uuid": None,
        "started": False,
        "current_step": 0,
        "acked_step": None,
        "envs": [],
        "fair_share": {},
        "next_key": 1,
        "counters": {},
    }


class Broker:
    def __init__(self, store: GroupStore, settings: BrokerSettings) -> None:
        self.store = store
        self.settings = settings
        self._recent: deque[bytes] = deque(maxlen=settings.recent_groups_kept)
        self._load()

    # -- state -------------------------------------------------------------------------

    def _load(self) -> None:
        snapshot = self.store.load()
        self._state = {**_fresh_state(), **snapshot.state}
        self._envs = [EnvRecord(**env) for env in self._state["envs"]]
        self._fair = FairShareState.from_dict(self._state["fair_share"])
        self._queue: dict[int, GroupMeta] = {}
        self._queued_bytes = 0
        self._env_sequences: Counter[int | None] = Counter()
        self._env_groups: Counter[int | None] = Counter()
        self._sizes: Counter[int] = Counter()
        for meta in snapshot.queued:
            self._enqueue(meta)
        self._batched = snapshot.batched
        self._batches = {batch.step: batch for batch in snapshot.batches}

    def _save_envs(self) -> None:
        self._state["envs"] = [asdict(env) for env in self._envs]

    def _count(self, name: str, amount: int = 1) -> None:
        counters = self._state["counters"]
        counters[name] = counters.get(name, 0) + amount

    def _enqueue(self, meta: GroupMeta) -> None:
        self._queue[meta.key] = meta
        self._queued_bytes += meta.nbytes
        self._env_sequences[meta.env_id] += meta.size
        self._env_groups[meta.env_id] += 1
        self._sizes[meta.size] += 1

    def _dequeue(self, key: int) -> GroupMeta:
        meta = self._queue.pop(key)
        self._queued_bytes -= meta.nbytes
        self._env_sequences[meta.env_id] -= meta.size
        self._env_groups[meta.env_id] -= 1
        self._sizes[meta.size] -= 1
        return meta

    def _drop(self, keys: Sequence[int], reason: str) -> None:
        if not keys:
            return
        for key in keys:
            self._dequeue(key)
        self._count(f"dropped_{reason}", len(keys))
        self.store.drop_groups(keys, self._state)
        logger.warning("dropped %d queued group(s): %s", len(keys), reason)

    @property
    def trainer(self) -> TrainerRegistration | None:
        raw = self._state["trainer"]
        return None if raw is None else TrainerRegistration.model_validate(raw)

    def _require_trainer(self) -> TrainerRegistration:
        trainer = self.trainer
        if trainer is None:
            raise TrainerNotRegisteredError(
                "no trainer registered; POST /register with the trainer's batch_size first"
            )
        return trainer

    def _env(self, env_id: int) -> EnvRecord:
        if not 0 <= env_id < len(self._envs):
            raise UnknownEnvError(env_id)
        return self._envs[env_id]

    @property
    def counters(self) -> dict[str, int]:
        return dict(self._state["counters"])

    @property
    def current_step(self) -> int:
        return int(self._state["current_step"])

    @property
    def envs(self) -> list[EnvRecord]:
        return list(self._envs)

    def queue_depth_by_env(self) -> dict[int | None, tuple[int, int]]:
        """(groups, sequences) queued per env id."""
        return {
            env: (groups, self._env_sequences[env])
            for env, groups in self._env_groups.items()
            if groups
        }

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    # -- trainer -------------------------------------------------------------------------

    def register_trainer(self, registration: TrainerRegistration) -> int:
        self._state["trainer"] = registration.model_dump()
        self._state["trainer_uuid"] = secrets.randbits(63)
        too_large = [k for k, m in self._queue.items() if m.size > registration.batch_size]
        self._drop(too_large, "group_too_large")
        too_long = [k for k, m in self._queue.items() if m.max_len > registration.max_token_len]
        self._drop(too_long, "too_long")
        start = registration.starting_step
        released = [step for step in self._batches if step <= start]
        redeliver = [step for step in self._batches if step > start]
        self._release(released)
        for step in redeliver:
            self._batches[step].delivered = False
        self._state["current_step"] = start
        self.store.set_delivered(redeliver, False, self._state)
        logger.info(
            "trainer registered: batch_size=%d max_token_len=%d starting_step=%d, "
            "%d batch(es) to re-deliver",
            registration.batch_size, registration.max_token_len, start, len(redeliver),
        )  # fmt: skip
        return int(self._state["trainer_uuid"])

    def _release(self, steps: Sequence[int]) -> None:
        if not steps:
            return
        for step in steps:
            for key in self._batches.pop(step).keys:
                self._batched.pop(key, None)
        self.store.release_batches(steps, self._state)

    def info(self) -> InfoResponse:
        trainer = self.trainer
        if trainer is None:
            return InfoResponse(batch_size=-1, max_token_len=-1)
        return InfoResponse(batch_size=trainer.batch_size, max_token_len=trainer.max_token_len)

    def wandb_info(self) -> WandbInfoResponse:
        trainer = self.trainer
        if trainer is None:
            return WandbInfoResponse(group=None, project=None)
        return WandbInfoResponse(group=trainer.wandb_group, project=trainer.wandb_project)

    def next_batch(self) -> tuple[int, list[dict[str, Any]]] | None:
        """The next batch for the trainer (re-deliveries first), or None without enough data."""
        trainer = self._require_trainer()
        if not self._state["started"]:
            self._state["started"] = True
            self.store.save_state(self._state)
        for step, batch in self._batches.items():
            if not batch.delivered:
                batch.delivered = True
                self._state["current_step"] = step
                self.store.set_delivered([step], True, self._state)
                return step, self._load_groups(batch.keys)
        self._drop_stale(trainer)
        refs = [QueuedGroupRef(key, m.env_id, m.size) for key, m in self._queue.items()]
        keys = form_batch(refs, trainer.batch_size, self._shares(), self._fair)
        if keys is None:
            return None
        step = self.current_step + 1
        self._state["current_step"] = step
        self._state["fair_share"] = self._fair.to_dict()
        for key in keys:
            self._batched[key] = self._dequeue(key)
        self._count("groups_out", len(keys))
        self._count("sequences_out", trainer.batch_size)
        batch = BatchRecord(step, tuple(keys), delivered=True)
        self._batches[step] = batch
        self.store.save_batch(batch, self._state)
        groups = self._load_groups(batch.keys)
        if not trainer.acknowledges:
            delivered = [s for s, b in self._batches.items() if b.delivered]
            excess = len(delivered) - self.settings.retain_delivered_batches
            self._release(delivered[: max(0, excess)])
        return step, groups

    def _load_groups(self, keys: Sequence[int]) -> list[dict[str, Any]]:
        return [decode_group(blob) for blob in self.store.payloads(keys)]

    def _shares(self) -> dict[int | None, EnvShare]:
        shares: dict[int | None, EnvShare] = {}
        for env in self._envs:
            minimum = env.min_batch_allocation if env.connected else None
            shares[env.env_id] = EnvShare(weight=env.weight, min_allocation=minimum)
        return shares

    def _drop_stale(self, trainer: TrainerRegistration) -> None:
        if trainer.max_staleness is None:
            return
        oldest = self.current_step - trainer.max_staleness
        stale = [
            key
            for key, meta in self._queue.items()
            if meta.policy_version is not None and meta.policy_version < oldest
        ]
        self._drop(stale, "stale")

    def ack(self, step: int) -> int:
        self._require_trainer()
        self._state["acked_step"] = max(step, self._state["acked_step"] or 0)
        self._release([s for s in self._batches if s <= step])
        self.store.save_state(self._state)
        return step

    # -- environments --------------------------------------------------------------------

    def register_env(
        self, registration: EnvRegistration
    ) -> EnvRegistrationResponse | WaitForTrainerResponse:
        trainer = self.trainer
        if trainer is None or not self._state["started"]:
            return WaitForTrainerResponse()
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
        self._save_envs()
        self.store.save_state(self._state)
        logger.info("env %d registered as %s", env.env_id, env.wandb_name)
        return EnvRegistrationResponse(
            env_id=env.env_id,
            wandb_name=env.wandb_name,
            checkpoint_dir=trainer.checkpoint_dir,
            starting_step=self.current_step,
            checkpoint_interval=trainer.save_checkpoint_interval,
            num_steps=trainer.num_steps,
        )

    def disconnect_env(self, env_id: int) -> None:
        self._env(env_id).connected = False
        self._save_envs()
        self.store.save_state(self._state)

    def status(self) -> StatusResponse:
        return StatusResponse(current_step=self.current_step, queue_size=len(self._queue))

    def status_env(self, env_id: int) -> EnvStatusResponse:
        env = self._env(env_id)
        connected = [e for e in self._envs if e.connected]
        total = sum(e.max_token_length * max(0.0, e.weight) for e in connected)
        weight = env.max_token_length * env.weight / total if total > 0 else 1.0
        minimums = [e.min_batch_allocation or 0.0 for e in connected]
        trainer = self.trainer
        batch_size = trainer.batch_size if trainer else 0
        reserved: dict[int | None, int] = {
            e.env_id: int(batch_size * (e.min_batch_allocation or 0.0)) for e in connected
        }
        own = self._env_sequences[env_id]
        others = sum(
            max(0, sequences - reserved.get(other, 0))
            for other, sequences in self._env_sequences.items()
            if other != env_id
        )
        return EnvStatusResponse(
            current_step=self.current_step,
            queue_size=(own + others) // env.group_size,
            unallocated_fraction=1.0 - min(1.0, sum(minimums)),
            self_queue_size=own // env.group_size,
            max_group_size=max((size for size, n in self._sizes.items() if n), default=1),
            env_weight=max(MIN_ENV_WEIGHT, weight),
        )

    # -- ingest --------------------------------------------------------------------------

    def _check(self, raw: Any, trainer: TrainerRegistration | None) -> tuple[CheckedGroup, bool]:
        checked = check_group(raw, batch_size=trainer.batch_size if trainer else None)
        if checked.env_id is not None:
            self._env(checked.env_id)
        too_long = trainer is not None and checked.max_len > trainer.max_token_len
        if too_long and self.settings.too_long_policy == "reject":
            assert trainer is not None
            raise InvalidGroupError(
                "tokens",
                f"a sequence has {checked.max_len} tokens, more than the trainer's max_token_len "
                f"{trainer.max_token_len}; truncate or filter it before sending",
            )
        return checked, too_long

    def ingest(self, raws: Sequence[Any], *, as_list: bool = False) -> IngestResult:
        """Validate every group, then queue all of them or none (errors name the index)."""
        trainer = self.trainer
        checked: list[tuple[CheckedGroup, bool]] = []
        for index, raw in enumerate(raws):
            try:
                checked.append(self._check(raw, trainer))
            except InvalidGroupError as err:
                if not as_list:
                    raise
                raise InvalidGroupError(f"[{index}].{err.field}", err.message) from err
        ids = {c.group_id for c, _ in checked if c.group_id is not None}
        seen = self.store.seen_group_ids(ids) if ids else set()
        fresh: list[CheckedGroup] = []
        duplicates = dropped = 0
        for group, too_long in checked:
            if group.group_id is not None and group.group_id in seen:
                duplicates += 1
                continue
            if group.group_id is not None:
                seen.add(group.group_id)
            if too_long:
                dropped += 1
                continue
            fresh.append(group)
        blobs = [encode_group(group.group) for group in fresh]
        new_bytes = sum(len(blob) for blob in blobs)
        self._check_room(len(fresh), new_bytes)
        new: list[NewGroup] = []
        for group, blob in zip(fresh, blobs, strict=True):
            key = int(self._state["next_key"])
            self._state["next_key"] = key + 1
            meta = GroupMeta(
                key, group.env_id, group.size, group.tokens, group.max_len, len(blob),
                group.policy_version,
            )  # fmt: skip
            new.append(NewGroup(meta, blob, group.group_id))
        self._count("groups_in", len(new))
        self._count("sequences_in", sum(g.meta.size for g in new))
        self._count("duplicates", duplicates)
        self._count("dropped_too_long", dropped)
        if new or duplicates or dropped:
            self.store.add_groups(new, self._state)
        for stored in new:
            self._enqueue(stored.meta)
            self._recent.append(stored.blob)
        if dropped:
            logger.warning("dropped %d group(s) with sequences past max_token_len", dropped)
        return IngestResult(accepted=len(new), duplicates=duplicates, dropped=dropped)

    def _check_room(self, groups: int, nbytes: int) -> None:
        limits = self.settings
        if len(self._queue) + groups > limits.max_queued_groups:
            message = f"queue holds {len(self._queue)} groups (limit {limits.max_queued_groups})"
        elif self._queued_bytes + nbytes > limits.max_queued_bytes:
            message = f"queue holds {self._queued_bytes} bytes (limit {limits.max_queued_bytes})"
        else:
            return
        self._count("rejected_queue_full", groups)
        raise QueueFullError(
            f"{message}; retry later, the trainer is behind", limits.retry_after_seconds
        )

    # -- read-only views -----------------------------------------------------------------

    def latest_example(self) -> dict[str, Any]:
        return decode_group(self._recent[-1]) if self._recent else dict(EMPTY_EXAMPLE)

    def recent_groups(self, limit: int, env_id: int | None = None) -> list[dict[str, Any]]:
        groups = [decode_group(blob) for blob in self._recent]
        if env_id is not None:
            groups = [g for g in groups if g.get("env_id") == env_id]
        return groups[-limit:] if limit > 0 else []

    def reset(self) -> None:
        self.store.reset()
        self._recent.clear()
        self._load()
        logger.info("broker reset: queue, batches, trainer and envs cleared")
