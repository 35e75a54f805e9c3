"""The broker's state machine: registration, ingest, batches, acks, status. No HTTP here.

Over 500 lines because one class keeps the queue, batch, ack and env-share invariants together.

Every change is written to the store (with the broker state, in one transaction) before the
method returns, so an HTTP layer that answers after the call never acknowledges something a
crash could lose. Methods are synchronous and meant to be called from one thread.
"""

from __future__ import annotations

import logging
import secrets
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from atroposlib.api.batching import FairShareState, QueuedGroupRef, form_batch
from atroposlib.api.envs import EnvRegistry
from atroposlib.api.settings import BrokerSettings
from atroposlib.api.state import BrokerState
from atroposlib.api.store import BatchRecord, GroupMeta, GroupStore, NewGroup, StoreSnapshot
from atroposlib.api.store.blob import decode_group, encode_group
from atroposlib.api.validation import CheckedGroup, check_group
from atroposlib.errors import (
    InvalidGroupError,
    QueueFullError,
    StoreWriteError,
    TrainerNotRegisteredError,
)
from atroposlib.wire.broker import (
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

RECENT_BYTES = 16 * 1024 * 1024
"""Memory bound of the groups kept for /recent_groups and /latest_example."""
EMPTY_EXAMPLE: dict[str, list[Any]] = {
    name: []
    for name in (
        "tokens", "masks", "scores", "advantages", "ref_logprobs", "generation_params",
        "inference_logprobs", "messages", "images",
    )
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class IngestResult:
    accepted: int
    duplicates: int
    dropped: int


def _trainer_identity(registration: TrainerRegistration) -> tuple[str, str, str]:
    """A trainer that re-registers with the same identity is resuming (and may rewind)."""
    return (registration.wandb_project, registration.wandb_group, registration.checkpoint_dir)


class Broker:
    """Queue, batches and registrations of one broker, kept in step with its store."""

    def __init__(self, store: GroupStore, settings: BrokerSettings) -> None:
        self.store = store
        self.settings = settings
        self._recent: deque[bytes] = deque()
        self._recent_bytes = 0
        self._load()

    # -- state -------------------------------------------------------------------------

    def _load(self) -> None:
        snapshot = self.store.load()
        self._state = BrokerState.from_stored(snapshot.state)
        self._envs = EnvRegistry(self._state.envs)
        saved_trainer = self._state.trainer
        self._trainer = (
            None if saved_trainer is None else TrainerRegistration.model_validate(saved_trainer)
        )
        self._fair = FairShareState.from_dict(self._state.fair_share)
        self._state_past(snapshot)
        if snapshot.log_damage:
            self._state.count("log_damage", snapshot.log_damage)
            self.store.save_state(self._state.to_stored())
        if snapshot.corrupt:
            self._discard_corrupt(snapshot)
        self._queue: dict[int, GroupMeta] = {}
        self._queued_bytes = 0
        self._env_sequences: Counter[int | None] = Counter()
        self._env_groups: Counter[int | None] = Counter()
        self._sizes: Counter[int] = Counter()
        self._refs: dict[int, QueuedGroupRef] = {}
        for meta in snapshot.queued:
            self._enqueue(meta)
        self._batched = snapshot.batched
        self._batches = {batch.step: batch for batch in snapshot.batches}
        kept = self.settings.recent_groups_kept
        newest = [meta.key for meta in snapshot.queued[-kept:]] if kept else []
        for blob in self.store.payloads(newest):
            self._remember(blob)

    def _state_past(self, snapshot: StoreSnapshot) -> None:
        """Keys and steps after everything stored, even if a damaged log lost a newer state."""
        keys = [meta.key for meta in snapshot.queued] + list(snapshot.batched)
        keys += [key for batch in snapshot.batches for key in batch.keys]
        self._state.next_key = max(self._state.next_key, max(keys, default=0) + 1)
        last_step = max((b.step for b in snapshot.batches if b.delivered), default=0)
        self._state.current_step = max(self._state.current_step, last_step)

    def _discard_corrupt(self, snapshot: StoreSnapshot) -> None:
        """Forget groups whose stored payload is damaged, with every batch holding one."""
        broken = [b for b in snapshot.batches if not snapshot.corrupt.isdisjoint(b.keys)]
        in_broken = {key for batch in broken for key in batch.keys}
        lost_keys = snapshot.corrupt | in_broken
        snapshot.queued = [meta for meta in snapshot.queued if meta.key not in lost_keys]
        snapshot.batches = [b for b in snapshot.batches if b not in broken]
        for key in lost_keys:
            snapshot.batched.pop(key, None)
        self._state.count("dropped_corrupt", len(lost_keys))
        queued_corrupt = snapshot.corrupt - in_broken
        if broken:
            self.store.release_batches(broken, self._state.to_stored())
        if queued_corrupt:
            self.store.drop_groups(queued_corrupt, self._state.to_stored())
        logger.error(
            "dropped %d stored group(s) (%d batch(es)) whose payload is damaged, e.g. by a "
            "power loss right after they were written",
            len(lost_keys), len(broken),
        )  # fmt: skip

    def _enqueue(self, meta: GroupMeta) -> None:
        self._queue[meta.key] = meta
        self._refs[meta.key] = QueuedGroupRef(meta.key, meta.env_id, meta.size)
        self._queued_bytes += meta.nbytes
        self._env_sequences[meta.env_id] += meta.size
        self._env_groups[meta.env_id] += 1
        self._sizes[meta.size] += 1

    def _dequeue(self, key: int) -> GroupMeta:
        meta = self._queue.pop(key)
        del self._refs[key]
        self._queued_bytes -= meta.nbytes
        self._env_sequences[meta.env_id] -= meta.size
        self._env_groups[meta.env_id] -= 1
        self._sizes[meta.size] -= 1
        return meta

    def _drop(self, keys: Sequence[int], reason: str, state: BrokerState) -> None:
        if not keys:
            return
        state.count(f"dropped_{reason}", len(keys))
        self.store.drop_groups(keys, state.to_stored())
        for key in keys:
            self._dequeue(key)
        logger.warning("dropped %d queued group(s): %s", len(keys), reason)

    @contextmanager
    def _transaction(self, what: str) -> Iterator[BrokerState]:
        """A draft of the state for the body to change and hand to the store; it becomes the
        state only when the body finishes. A store that cannot write (a full disk) leaves the
        state as it was and becomes a 503 + Retry-After naming ``what``."""
        draft = self._state.draft()
        try:
            yield draft
        except OSError as err:
            raise self._store_failed(what, err) from err
        self._state = draft

    @property
    def trainer(self) -> TrainerRegistration | None:
        return self._trainer

    def _require_trainer(self) -> TrainerRegistration:
        trainer = self.trainer
        if trainer is None:
            raise TrainerNotRegisteredError(
                "no trainer registered; POST /register with the trainer's batch_size first"
            )
        return trainer

    @property
    def counters(self) -> dict[str, int]:
        return dict(self._state.counters)

    @property
    def current_step(self) -> int:
        return self._state.current_step

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
        current = self._trainer
        if current is not None and _trainer_identity(current) != _trainer_identity(registration):
            # A second consumer (a data tool such as atropos-sft-gen, a viewer) must not
            # rewind the running trainer's step; Atropos ignored such registrations too.
            logger.info(
                "registration from %s/%s (%s) kept as an observer: trainer %s/%s owns the run",
                registration.wandb_project, registration.wandb_group, registration.checkpoint_dir,
                current.wandb_project, current.wandb_group,
            )  # fmt: skip
            return secrets.randbits(63)
        start = registration.starting_step
        with self._transaction("the registration") as state:
            state.trainer = registration.model_dump()
            state.trainer_uuid = secrets.randbits(63)
            too_large = [k for k, m in self._queue.items() if m.size > registration.batch_size]
            self._drop(too_large, "group_too_large", state)
            limit = registration.max_token_len
            self._drop([k for k, m in self._queue.items() if m.max_len > limit], "too_long", state)
            self._release([step for step in self._batches if step <= start], state)
            redeliver = [step for step in self._batches if step > start]
            state.current_step = start
            self.store.set_delivered(redeliver, False, state.to_stored())
        self._trainer = registration
        for step in redeliver:
            self._batches[step].delivered = False
        logger.info(
            "trainer registered: batch_size=%d max_token_len=%d starting_step=%d, "
            "%d batch(es) to re-deliver",
            registration.batch_size, registration.max_token_len, start, len(redeliver),
        )  # fmt: skip
        return int(state.trainer_uuid)

    def _release(self, steps: Sequence[int], state: BrokerState) -> bool:
        """Forget these batches and their groups, on disk first; False when there were none."""
        if not steps:
            return False
        self.store.release_batches([self._batches[step] for step in steps], state.to_stored())
        for step in steps:
            for key in self._batches.pop(step).keys:
                self._batched.pop(key, None)
        return True

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

    def next_batch(
        self, *, packed: bool = False, received: int | None = None
    ) -> tuple[int, list[dict[str, Any]]] | None:
        """The next batch for the trainer (re-deliveries first), or None without enough data.

        ``packed``: groups as the msgpack answer carries them (see ``decode_group``).
        ``received``: the last step the trainer got; a kept batch after it was lost on its way
        (a timeout, a proxy reset, a broker killed before answering) and is sent again, in step
        order, before anything new. Trainers that do not name it get each batch once.
        """
        trainer = self._require_trainer()
        if not self._state.started:
            with self._transaction("the trainer's start") as state:
                state.started = True
                self.store.save_state(state.to_stored())
        for step, batch in self._batches.items():
            if not batch.delivered:
                with self._transaction("the delivery") as state:
                    state.current_step = step
                    self.store.set_delivered([step], True, state.to_stored())
                batch.delivered = True
                return step, self._load_groups(batch.keys, packed)
            if received is not None and step > received:
                logger.info("sending batch %d again: the trainer last received %d", step, received)
                self._state.count("batches_resent")
                return step, self._load_groups(batch.keys, packed)
        stale = self._stale_keys(trainer)
        if stale:
            with self._transaction("the dropping of stale groups") as state:
                self._drop(stale, "stale", state)
        if sum(self._env_sequences.values()) < trainer.batch_size:
            return None
        refs = list(self._refs.values())  # arrival order: dicts keep insertion order
        fair_before = self._fair.to_dict()
        keys = form_batch(refs, trainer.batch_size, self._envs.shares(), self._fair)
        if keys is None:
            return None
        step = self.current_step + 1
        batch = BatchRecord(step, tuple(keys), delivered=True)
        try:
            with self._transaction("the batch") as state:
                state.current_step = step
                state.fair_share = self._fair.to_dict()
                state.count("groups_out", len(keys))
                state.count("sequences_out", trainer.batch_size)
                self.store.save_batch(batch, state.to_stored())
        except StoreWriteError:  # e.g. a full disk: the batch was not formed, its groups stay
            self._fair = FairShareState.from_dict(fair_before)
            raise
        for key in keys:
            self._batched[key] = self._dequeue(key)
        self._batches[step] = batch
        groups = self._load_groups(batch.keys, packed)
        if not trainer.acknowledges:
            delivered = [s for s, b in self._batches.items() if b.delivered]
            excess = len(delivered) - self.settings.retain_delivered_batches
            draft = self._state.draft()
            try:
                self._release(delivered[: max(0, excess)], draft)
            except OSError as err:  # kept on disk: re-delivered after a restart, never lost
                logger.warning("could not release old batches: %s", err)
            else:
                self._state = draft
        return step, groups

    def _store_failed(self, what: str, err: OSError) -> StoreWriteError:
        logger.error("could not store %s: %s", what, err)
        return StoreWriteError(
            f"the broker cannot store {what} right now ({err.strerror or err}); retry later "
            "(its store's disk may be full)",
            self.settings.retry_after_seconds,
        )

    def _load_groups(self, keys: Sequence[int], packed: bool) -> list[dict[str, Any]]:
        return [decode_group(blob, packed=packed) for blob in self.store.payloads(keys)]

    def _stale_keys(self, trainer: TrainerRegistration) -> list[int]:
        if trainer.max_staleness is None:
            return []
        oldest = self.current_step - trainer.max_staleness
        return [
            key
            for key, meta in self._queue.items()
            if meta.policy_version is not None and meta.policy_version < oldest
        ]

    def ack(self, step: int) -> int:
        self._require_trainer()
        with self._transaction("the acknowledgement") as state:
            state.acked_step = max(step, state.acked_step or 0)
            if not self._release([s for s in self._batches if s <= step], state):
                self.store.save_state(state.to_stored())
        return step

    # -- environments --------------------------------------------------------------------

    def register_env(
        self, registration: EnvRegistration
    ) -> EnvRegistrationResponse | WaitForTrainerResponse:
        trainer = self.trainer
        if trainer is None or not self._state.started:
            return WaitForTrainerResponse()
        with self._transaction("the registration") as state:
            envs = EnvRegistry(state.envs)
            env = envs.register(registration)
            state.envs = envs.to_state()
            self.store.save_state(state.to_stored())
        self._envs = envs
        return EnvRegistrationResponse(
            env_id=env.env_id,
            wandb_name=env.wandb_name,
            checkpoint_dir=trainer.checkpoint_dir,
            starting_step=self.current_step,
            checkpoint_interval=trainer.save_checkpoint_interval,
            num_steps=trainer.num_steps,
        )

    def disconnect_env(self, env_id: int) -> None:
        with self._transaction("the disconnection") as state:
            envs = EnvRegistry(state.envs)
            envs.disconnect(env_id)
            state.envs = envs.to_state()
            self.store.save_state(state.to_stored())
        self._envs = envs

    def status(self) -> StatusResponse:
        return StatusResponse(current_step=self.current_step, queue_size=len(self._queue))

    def status_env(self, env_id: int) -> EnvStatusResponse:
        trainer = self.trainer
        return self._envs.status(
            env_id,
            current_step=self.current_step,
            batch_size=trainer.batch_size if trainer else 0,
            queued_sequences=self._env_sequences,
            max_group_size=max((size for size, n in self._sizes.items() if n), default=1),
        )

    # -- ingest --------------------------------------------------------------------------

    def _check(
        self, raw: Any, trainer: TrainerRegistration | None
    ) -> tuple[CheckedGroup, bool, bytes]:
        checked = check_group(raw, batch_size=trainer.batch_size if trainer else None)
        if checked.env_id is not None:
            self._envs.get(checked.env_id)
        too_long = trainer is not None and checked.max_len > trainer.max_token_len
        if too_long and self.settings.too_long_policy == "reject":
            assert trainer is not None
            raise InvalidGroupError(
                "tokens",
                f"a sequence has {checked.max_len} tokens, more than the trainer's max_token_len "
                f"{trainer.max_token_len}; truncate or filter it before sending",
            )
        self._refuse_stale(checked, trainer)
        return checked, too_long, encode_group(checked.group)

    def _refuse_stale(self, checked: CheckedGroup, trainer: TrainerRegistration | None) -> None:
        if self.settings.stale_policy != "reject" or trainer is None:
            return
        version, limit = checked.policy_version, trainer.max_staleness
        if version is None or limit is None or version >= self.current_step - limit:
            return
        raise InvalidGroupError(
            "policy_versions",
            f"the group's oldest token was sampled by weights of step {version}, more than the "
            f"trainer's max_staleness {limit} steps before step {self.current_step}; resample "
            "it on newer weights",
        )

    def ingest(self, raws: Sequence[Any], *, as_list: bool = False) -> IngestResult:
        """Validate every group, then queue all of them or none (errors name the index)."""
        trainer = self.trainer
        checked: list[tuple[CheckedGroup, bool, bytes]] = []
        for index, raw in enumerate(raws):
            try:
                checked.append(self._check(raw, trainer))
            except InvalidGroupError as err:
                if not as_list:
                    raise
                raise InvalidGroupError(f"[{index}].{err.field}", err.message) from err
        ids = {c.group_id for c, _, _ in checked if c.group_id is not None}
        seen = self.store.seen_group_ids(ids) if ids else set()
        fresh: list[tuple[CheckedGroup, bytes]] = []
        duplicates = dropped = 0
        for group, too_long, blob in checked:
            if group.group_id is not None and group.group_id in seen:
                duplicates += 1
                continue
            if group.group_id is not None:
                seen.add(group.group_id)
            if too_long:
                dropped += 1
                continue
            fresh.append((group, blob))
        self._check_room(len(fresh), sum(len(blob) for _, blob in fresh))
        new: list[NewGroup] = []
        # a full disk: nothing was stored, nothing counted, the sender retries
        with self._transaction(f"{len(fresh)} group(s)") as state:
            for group, blob in fresh:
                meta = GroupMeta(
                    state.next_key, group.env_id, group.size, group.tokens, group.max_len,
                    len(blob), group.policy_version,
                )  # fmt: skip
                state.next_key += 1
                new.append(NewGroup(meta, blob, group.group_id))
            state.count("groups_in", len(new))
            state.count("sequences_in", sum(g.meta.size for g in new))
            state.count("duplicates", duplicates)
            state.count("dropped_too_long", dropped)
            if new or duplicates or dropped:
                self.store.add_groups(new, state.to_stored())
        for stored in new:
            self._enqueue(stored.meta)
            self._remember(stored.blob)
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
        self._state.count("rejected_queue_full", groups)
        raise QueueFullError(
            f"{message}; retry later, the trainer is behind", limits.retry_after_seconds
        )

    # -- read-only views -----------------------------------------------------------------

    def _remember(self, blob: bytes) -> None:
        """Keep the newest groups for /recent_groups, by count and within RECENT_BYTES."""
        if self.settings.recent_groups_kept == 0:
            return
        self._recent.append(blob)
        self._recent_bytes += len(blob)
        while len(self._recent) > 1 and (
            len(self._recent) > self.settings.recent_groups_kept
            or self._recent_bytes > RECENT_BYTES
        ):
            self._recent_bytes -= len(self._recent.popleft())

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
        self._recent_bytes = 0
        self._load()
        logger.info("broker reset: queue, batches, trainer and envs cleared")
