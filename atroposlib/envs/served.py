"""The public face of ``BaseEnv`` that the CLI, the modes and the ``serve`` runner use.

They run an env; they do not import it: ``BaseEnv.cli()`` calls the CLI, so the CLI and
what it drives see the env only through these protocols (the import graph stays one-way).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from atroposlib.envs.config import BaseEnvConfig
from atroposlib.envs.server_handling.server_baseline import APIServerConfig, ServerBaseline
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.envs.stats import PerfStats
from atroposlib.envs.tracking import Tracker
from atroposlib.type_definitions import Item
from atroposlib.wire.broker import EnvRegistrationResponse, EnvStatusResponse

SubmitGroup = Callable[[dict[str, Any]], None]
"""Hands a validated group to the sender (stamped with its ids and policy version)."""
OnStep = Callable[[int], Awaitable[None]]
"""Called with the trainer's step whenever ``/status-env`` reports a new one."""


class ServedEnv(Protocol):
    """An environment as the CLI builds it and ``serve``, ``process``, ``evaluate`` drive it."""

    name: str | None
    serving: bool
    config: BaseEnvConfig
    server: ServerManager
    perf: PerfStats
    tracker: Tracker
    backlog: list[Item]
    env_id: int | None
    curr_step: int
    max_num_workers: int
    max_token_len: int
    checkpoint_interval: int
    broker_num_steps: int
    items_sent_this_step: int
    groups_submitted: int
    last_failure: str | None
    last_rollout_raised: bool
    status_dict: dict[str, Any]

    def __init__(
        self,
        config: BaseEnvConfig,
        server_configs: ServerBaseline | Sequence[APIServerConfig],
        slurm: bool = False,
        testing: bool = False,
    ) -> None: ...
    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, ServerBaseline | list[APIServerConfig]]: ...
    async def setup(self) -> None: ...
    async def evaluate(self, *args: Any, **kwargs: Any) -> Any: ...
    async def evaluate_log(
        self, metrics: dict[str, Any], *, start_time: float | None, end_time: float | None
    ) -> None: ...
    async def next_item(self) -> Item: ...
    async def run_item(
        self,
        item: Item,
        *,
        max_token_len: int | None = None,
        dropped: list[dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]: ...
    async def run_evaluate(self) -> None: ...
    async def env_step_checks(self) -> None: ...
    async def wandb_log(self, wandb_metrics: dict[str, Any] | None = None) -> None: ...
    @property
    def tokenizer(self) -> Any: ...
    def tokenizer_or_none(self) -> Any: ...
    def derived_batch_size(self, status: EnvStatusResponse | None = None) -> int: ...
    def save_checkpoint(self, step: int, data: dict[str, Any] | None = None) -> None: ...
    def load_checkpoint(self) -> None: ...
    def attach_registration(self, answer: EnvRegistrationResponse) -> None: ...
    def attach_runner(self, submit: SubmitGroup, on_step: OnStep) -> None: ...
    def start_tracker(
        self, *, project: str | None, group: str | None, run_name: str | None = None
    ) -> None: ...
    @property
    def aggregates_rollouts(self) -> bool: ...
