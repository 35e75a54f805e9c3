"""``serve``: the worker pool that keeps the broker fed without running ahead of the trainer."""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson

from atroposlib.envs.config import EvalHandlingEnum
from atroposlib.envs.sender import GroupSender
from atroposlib.envs.spool import Spool
from atroposlib.envs.storage import free_path
from atroposlib.errors import (
    BrokerRejectedError,
    BrokerUnavailableError,
    ConfigError,
    InferenceEngineDeadError,
)
from atroposlib.wire.broker import EnvRegistration, EnvStatusResponse

if TYPE_CHECKING:
    from atroposlib.client import EnvClient
    from atroposlib.envs.served import ServedEnv

logger = logging.getLogger(__name__)

RECENT_ROLLOUTS = 64
"""Finished rollouts whose outcome (a group sent or not) sets the in-flight budget."""
LEAST_SENT_SHARE = 0.25
"""The in-flight budget grows at most 1 / this when most rollouts send nothing."""


@dataclass
class Rollout:
    item: Any
    task: asyncio.Task[None]
    started: float = field(default_factory=time.monotonic)


class EnvRunner:
    """Registers the env, then loops: read ``/status-env``, start rollouts, evaluate, checkpoint."""

    def __init__(
        self,
        env: ServedEnv,
        client: EnvClient,
        *,
        spool_path: str | Path | None = None,
        status_interval_s: float = 0.2,
    ) -> None:
        self.env = env
        self.client = client
        self.status_interval_s = status_interval_s
        name = env.config.wandb_name or env.name or type(env).__name__
        self.spool = Spool(spool_path or Path(".atropos_spool") / f"{name}.jsonl")
        self.sender = GroupSender(client, self.spool, on_unknown_env=self._register)
        self.rollouts: dict[str, Rollout] = {}
        self.status: EnvStatusResponse | None = None
        self.status_at = 0.0
        self.submitted_at_status = 0
        self.acked_during_status = 0
        self.eval_task: asyncio.Task[None] | None = None
        self.fatal: InferenceEngineDeadError | None = None
        """Set by a rollout that found no live inference engine: the loop stops with it."""
        self.outcomes: deque[bool] = deque(maxlen=RECENT_ROLLOUTS)
        """Whether each recent rollout sent a group (an env that drops all-equal groups
        sends from a fraction of them)."""
        self.group_file: IO[bytes] | None = None
        if env.config.data_path_to_save_groups:
            path = free_path(Path(env.config.data_path_to_save_groups))
            path.parent.mkdir(parents=True, exist_ok=True)
            self.group_file = path.open("ab")
            logger.info("every group sent is also written to %s", path)

    # ---- start-up -------------------------------------------------------------------

    async def _register(self) -> int:
        config = self.env.config
        registration = EnvRegistration(
            max_token_length=config.max_token_length,
            desired_name=config.wandb_name or self.env.name or type(self.env).__name__,
            weight=config.inference_weight if config.inference_weight > 0 else 1.0,
            group_size=config.group_size,
            min_batch_allocation=config.min_batch_allocation,
        )
        answer = await self.client.register_env(registration)
        self.env.attach_registration(answer)
        logger.info("registered as env %d (%s)", answer.env_id, answer.wandb_name)
        return answer.env_id

    async def _fetch_info(self) -> None:
        info = await self.client.info()
        config = self.env.config
        if info.batch_size > 0:
            config.batch_size = info.batch_size
        if info.max_token_len > 0:
            self.env.max_token_len = info.max_token_len
        if config.batch_size <= 0:
            raise ConfigError(
                "batch_size is unknown: the trainer has not registered with the broker"
            )
        if config.group_size > config.batch_size:
            raise ConfigError(
                f"group_size {config.group_size} exceeds the trainer's batch_size "
                f"{config.batch_size}; lower --env.group_size"
            )
        if config.total_steps == -1:
            config.total_steps = self.env.broker_num_steps

    async def run(self) -> None:
        env = self.env
        await env.setup()
        while True:
            try:
                await self._register()
                break
            except BrokerUnavailableError as exc:
                logger.warning("broker not reachable yet (%s); retrying registration", exc)
                await asyncio.sleep(2.0)
        wandb = await self.client.wandb_info()
        env.start_tracker(project=wandb.project, group=wandb.group)
        await self._fetch_info()
        if env.curr_step > 0:
            env.load_checkpoint()
        for group in self.spool.pending.values():  # left over from an earlier run of this env
            group["env_id"] = env.env_id
        self.sender.start()
        env.attach_runner(self.submit, self._on_step)
        try:
            await self._loop()
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        for rollout in self.rollouts.values():
            rollout.task.cancel()
        if self.eval_task is not None:
            self.eval_task.cancel()
        flush_s = 0 if self.sender.unauthorized else 60  # a refused key will not be accepted
        if self.sender.started and not await self.sender.flush(timeout=flush_s):
            logger.warning("%d groups still spooled at %s", self.sender.backlog, self.spool.path)
        await self.sender.close()
        if self.group_file is not None:
            self.group_file.close()
        if self.env.env_id is not None:
            try:
                await self.client.disconnect_env(self.env.env_id)
            except (BrokerUnavailableError, BrokerRejectedError) as exc:
                logger.warning("could not disconnect from the broker: %s", exc)
        self.env.tracker.finish()

    # ---- the loop -------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            if self.fatal is not None:
                raise self.fatal
            status = await self._refresh_status()
            if status is not None:
                self.env.status_dict = status.model_dump()
                await self.env.env_step_checks()
                if status.current_step >= self.env.config.total_steps:
                    logger.info("trainer reached total_steps %d: stopping", status.current_step)
                    if self.eval_task is not None:
                        await self.eval_task
                    return
                await self._start_rollouts(status)
            self._cancel_timed_out()
            pending = {r.task for r in self.rollouts.values()}
            if pending:
                await asyncio.wait(
                    pending, timeout=self.status_interval_s, return_when="FIRST_COMPLETED"
                )
            else:
                await asyncio.sleep(self.status_interval_s)

    async def _refresh_status(self) -> EnvStatusResponse | None:
        if self.status is not None and time.monotonic() - self.status_at < self.status_interval_s:
            return self.status
        env_id = self.env.env_id
        assert env_id is not None
        submitted, acked = self.env.groups_submitted, self.sender.sent
        try:
            self.status = await self.client.status_env(env_id)
        except BrokerUnavailableError as exc:
            logger.warning("broker unreachable (%s): not starting rollouts", exc)
            self.status = None
            return None
        except BrokerRejectedError as exc:
            if exc.status_code != 404:
                raise
            await self._register()
            return None
        self.status_at = time.monotonic()
        # posts acknowledged while the status was in flight may not be counted in it
        self.submitted_at_status = submitted
        self.acked_during_status = self.sender.sent - acked
        await self.env.server.update_weight(self.status.env_weight)
        return self.status

    def sent_share(self) -> float:
        """The share of recent rollouts that sent a group (1 until a few have finished)."""
        if len(self.outcomes) < 8:
            return 1.0
        return max(LEAST_SENT_SHARE, sum(self.outcomes) / len(self.outcomes))

    def worker_budget(self, status: EnvStatusResponse) -> int:
        """How many rollouts may run now, from worker limits, evals and off-policy limits.

        The off-policy limit bounds the groups *sent* and waiting: when most rollouts send
        nothing (their groups dropped as all-equal), more of them run at once, so that those
        expected to be sent still fit (:meth:`sent_share`)."""
        env, config = self.env, self.env.config
        limit = env.max_num_workers
        if self.eval_task is not None and not self.eval_task.done():
            if config.eval_handling is EvalHandlingEnum.STOP_TRAIN:
                return 0
            if config.eval_handling is EvalHandlingEnum.LIMIT_TRAIN:
                limit = int(limit * config.eval_limit_ratio)
        unsent = max(self.sender.backlog, env.groups_submitted - self.submitted_at_status)
        unsent += self.acked_during_status
        queued = status.queue_size + unsent
        projected = status.current_step + queued * config.group_size // max(1, config.batch_size)
        if projected >= config.total_steps:
            return 0
        if config.max_batches_offpolicy <= 0:
            return limit
        allowed = config.max_batches_offpolicy * env.derived_batch_size(status) // config.group_size
        budget = math.ceil(max(0, allowed - queued) / self.sent_share())
        if config.min_batch_allocation is not None:
            own_target = math.ceil(
                config.min_batch_allocation
                * config.batch_size
                * config.max_batches_offpolicy
                / config.group_size
            )
            budget = max(budget, own_target - status.self_queue_size)
        return max(0, min(limit, budget))

    async def _start_rollouts(self, status: EnvStatusResponse) -> None:
        budget = self.worker_budget(status)
        while len(self.rollouts) < budget:
            item = await self.env.next_item()
            if item is None:
                return
            self._spawn(item, status.current_step)

    def _spawn(self, item: Any, policy_version: int) -> None:
        key = uuid.uuid4().hex
        task = asyncio.create_task(self._rollout(key, item, policy_version))
        self.rollouts[key] = Rollout(item, task)

    def submit(self, group: dict[str, Any], policy_version: int | None = None) -> None:
        """Stamp a valid group with its ids and hand it to the sender (and the JSONL file)."""
        group["env_id"] = self.env.env_id
        group["policy_version"] = self.env.curr_step if policy_version is None else policy_version
        group["group_id"] = uuid.uuid4().hex
        self.env.groups_submitted += 1
        self.sender.submit(group)
        if self.group_file is not None:
            self.group_file.write(orjson.dumps(group) + b"\n")
            self.group_file.flush()

    def record_dropped(self, group: dict[str, Any], policy_version: int) -> None:
        """Write a group the env left out (all scores equal) to the JSONL file, marked
        ``"dropped"``, so the file holds every sample; it is never sent."""
        if self.group_file is None:
            return
        group["env_id"] = self.env.env_id
        group["policy_version"] = policy_version
        self.group_file.write(orjson.dumps(group) + b"\n")
        self.group_file.flush()

    async def _rollout(self, key: str, item: Any, policy_version: int) -> None:
        dropped: list[dict[str, Any]] = []
        try:
            groups = await self.env.run_item(item, dropped=dropped)
            self.outcomes.append(bool(groups))
            for group in groups:
                self.submit(group, policy_version)
            for group in dropped:
                self.record_dropped(group, policy_version)
        except InferenceEngineDeadError as exc:
            self.fatal = exc
        finally:
            self.rollouts.pop(key, None)

    def _cancel_timed_out(self) -> None:
        timeout = self.env.config.worker_timeout
        if timeout <= 0:
            return
        now = time.monotonic()
        for key, rollout in list(self.rollouts.items()):
            if now - rollout.started > timeout:
                logger.warning("rollout %s exceeded worker_timeout %.0f s: cancelled", key, timeout)
                rollout.task.cancel()
                self.rollouts.pop(key, None)
                self.env.perf.failed += 1

    # ---- steps: evals, checkpoints, logging -----------------------------------------

    async def _on_step(self, step: int) -> None:
        env, config = self.env, self.env.config
        previous = env.curr_step
        if step == previous:
            return
        env.curr_step = step
        if (
            config.steps_per_eval > 0
            and step // config.steps_per_eval > previous // config.steps_per_eval
        ):
            self._start_eval()
        interval = env.checkpoint_interval
        if interval > 0 and step // interval > previous // interval:
            env.save_checkpoint((step // interval) * interval)
        if env.items_sent_this_step >= config.min_items_sent_before_logging:
            env.items_sent_this_step = 0
            await env.wandb_log({})

    def _start_eval(self) -> None:
        if self.eval_task is not None and not self.eval_task.done():
            logger.warning("previous evaluate() still running: skipping this eval")
            return
        if self.env.config.eval_handling is EvalHandlingEnum.STOP_TRAIN:
            for key, rollout in list(self.rollouts.items()):
                rollout.task.cancel()
                self.env.backlog.append(rollout.item)
                self.rollouts.pop(key, None)
        self.eval_task = asyncio.create_task(self.env.run_evaluate())
