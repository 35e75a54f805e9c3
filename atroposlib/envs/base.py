"""``BaseEnv``: the class environment authors subclass (Atropos 0.4 hooks and names).

Subclasses implement ``get_next_item`` and either ``collect_trajectory`` (one rollout) or
``collect_trajectories`` (a whole group), optionally ``setup``, ``evaluate``,
``postprocess_histories``, ``wandb_log`` and ``config_init``. Running them is not this
module's job: ``runner.EnvRunner`` serves, ``modes`` processes and evaluates, ``cli`` parses.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

from atroposlib.envs import checkpointing
from atroposlib.envs.config import BaseEnvConfig, EvalHandlingEnum
from atroposlib.envs.evaluation import write_eval_results
from atroposlib.envs.groups import (
    ScoredDataGroup,
    ScoredDataItem,
    group_from_items,
    group_rejection_reason,
)
from atroposlib.envs.rollouts import TokenSampler
from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    ServerBaseline,
)
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.envs.stats import RolloutStats
from atroposlib.envs.tracking import NullTracker, Tracker, make_tracker
from atroposlib.errors import InferenceUnavailableError
from atroposlib.group import ScoredData, checked_wire_form, invalid_group_reason
from atroposlib.protocol import EnvRegistrationResponse, EnvStatusResponse
from atroposlib.type_definitions import Item

logger = logging.getLogger(__name__)

__all__ = ["BaseEnv", "BaseEnvConfig", "EvalHandlingEnum", "ScoredDataGroup", "ScoredDataItem"]

Group = ScoredData | ScoredDataGroup
Trajectories = Group | Sequence[Group | None] | None


class BaseEnv(ABC):
    name: str | None = None
    env_config_cls: type[BaseEnvConfig] = BaseEnvConfig
    server_cls: type[APIServer] | None = None
    serving: bool = False  # set by ``serve`` before setup(): code envs refuse weak sandboxes

    def __init__(
        self,
        config: BaseEnvConfig,
        server_configs: ServerBaseline | Sequence[APIServerConfig],
        slurm: bool = False,
        testing: bool = False,
    ) -> None:
        self.config = config
        self.server = ServerManager(
            server_configs, server_class=self.server_cls, slurm=slurm, testing=testing
        )
        self.max_num_workers = config.max_num_workers
        if self.max_num_workers == -1:
            self.max_num_workers = config.max_num_workers_per_node * len(self.server.servers)
        self.backlog: list[Item] = []
        self.eval_workers: set[asyncio.Task[Any]] = set()
        self.curr_step = 0
        self.env_id: int | None = None
        self.wandb_prepend: str | None = None
        self.checkpoint_dir = ""
        self.checkpoint_interval = -1
        self.broker_num_steps = -1
        self.max_token_len = -1
        self.items_sent_this_step = 0
        self.groups_submitted = 0
        self.stats = RolloutStats(config)
        self.perf = self.stats.perf
        self.tracker: Tracker = NullTracker()
        self.rollouts_for_wandb: list[list[tuple[Any, float]]] = []
        self._submit: Callable[[dict[str, Any]], None] | None = None
        self._tokenizer: Any = None

    # ---- what subclasses implement ---------------------------------------------------

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, ServerBaseline | list[APIServerConfig]]:
        """Default (env config, server configs); the CLI, env vars and YAML override them."""
        return cls.env_config_cls(), ServerBaseline()

    async def setup(self) -> None:  # noqa: B027 - optional hook
        """Load datasets, build state; called once before anything else."""

    @abstractmethod
    async def get_next_item(self) -> Item:
        """The next item to roll out (``None`` when there is nothing to do right now)."""

    async def collect_trajectory(self, item: Item) -> tuple[ScoredDataItem | None, list[Item]]:
        """One rollout of ``item``; the default collect_trajectories calls it group_size times."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement collect_trajectory or collect_trajectories"
        )

    async def collect_trajectories(self, item: Item) -> tuple[Trajectories, list[Item]]:
        """A group (or several, or None) for ``item``, plus items to put on the backlog."""
        results = await asyncio.gather(
            *(self.collect_trajectory(item) for _ in range(self.config.group_size))
        )
        backlog = [extra for _, extras in results for extra in extras]
        rollouts = [rollout for rollout, _ in results if rollout is not None]
        if not rollouts:
            return None, backlog
        return group_from_items(rollouts), backlog

    async def postprocess_histories(self, trajectories: Trajectories) -> Trajectories:
        """Change groups after collection (e.g. add advantages); identity by default."""
        return trajectories

    async def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        """Run an evaluation; called every ``steps_per_eval`` trainer steps and by ``evaluate``."""
        logger.info("%s defines no evaluate()", type(self).__name__)

    async def cleanup(self) -> None:  # noqa: B027 - optional hook
        """Called after every item's rollout."""

    # ---- helpers for subclasses ------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.config.tokenizer_name)
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self._tokenizer = value

    def token_sampler(
        self, *, max_tokens: int | None = None, temperature: float | None = None, **sampling: Any
    ) -> TokenSampler:
        """Token-in/token-out sampling on this env's servers (see ``atroposlib.envs.rollouts``).

        Defaults: the config's ``max_completion_tokens`` and ``temperature`` (else 1.0).
        """
        if max_tokens is None:
            max_tokens = getattr(self.config, "max_completion_tokens", None)
        if max_tokens is None:
            raise ValueError("pass max_tokens (the config has no max_completion_tokens)")
        if temperature is None:
            temperature = float(getattr(self.config, "temperature", 1.0))
        return TokenSampler(
            self.server, self.tokenizer, max_tokens=max_tokens, temperature=temperature, **sampling
        )

    def derived_batch_size(self, status: EnvStatusResponse | None = None) -> int:
        """This env's share of a batch: the unallocated share plus its minimum allocation."""
        if status is None or self.config.batch_size == -1:
            return self.config.batch_size
        share = status.unallocated_fraction + (self.config.min_batch_allocation or 0.0)
        return int(self.config.batch_size * min(1.0, share))

    def save_checkpoint(self, step: int, data: dict[str, Any] | None = None) -> None:
        """Override to pass ``data``; it is handed back to you (as attributes) on resume."""
        if data is None or not self.checkpoint_dir or self.wandb_prepend is None:
            return
        checkpointing.save_checkpoint(self.checkpoint_dir, self.wandb_prepend, step, data)

    def load_checkpoint(self) -> None:
        if not self.checkpoint_dir or self.wandb_prepend is None:
            return
        data = checkpointing.load_checkpoint(
            self.checkpoint_dir, self.wandb_prepend, self.curr_step
        )
        for key, value in (data or {}).items():
            setattr(self, key, value)

    @property
    def completion_lengths(self) -> list[int]:
        return self.stats.completion_lengths

    @completion_lengths.setter
    def completion_lengths(self, value: list[int]) -> None:
        self.stats.completion_lengths = value

    async def add_rollouts_for_wandb(
        self, scored_data: Group | dict[str, Any], item: Item = None
    ) -> None:
        """Keep rollouts for the wandb table (token ids are decoded only when logged)."""
        if isinstance(scored_data, ScoredData):
            scored_data = scored_data.wire()
        keep = self.config.num_rollouts_per_group_for_logging
        keep = len(scored_data["tokens"]) if keep == -1 else keep
        pairs = zip(scored_data["tokens"][:keep], scored_data["scores"][:keep], strict=True)
        self.rollouts_for_wandb.append([(tokens, float(score)) for tokens, score in pairs])
        del self.rollouts_for_wandb[: -max(1, self.config.num_rollouts_to_keep)]

    async def create_rollout_table(self, wandb_metrics: dict[str, Any]) -> dict[str, Any]:
        rows = [
            [self._as_text(content), score]
            for group in self.rollouts_for_wandb
            for content, score in group
        ]
        table = self.tracker.table(["text", "score"], rows) if rows else None
        if table is not None:
            wandb_metrics["train/rollouts"] = table
        return wandb_metrics

    def _as_text(self, content: Any) -> str:
        if isinstance(content, str):
            return content
        if self._tokenizer is not None:
            return str(self._tokenizer.decode(content))
        return str(content)

    async def handle_send_to_api(
        self,
        scored_data: Trajectories,
        item: Item = None,
        do_send_to_api: bool = True,
        abort_on_any_max_length_exceeded: bool = True,
    ) -> None:
        """Validate groups and send them now (for envs that send from inside a rollout)."""
        limit = None if abort_on_any_max_length_exceeded else -1
        for group in self.accept_groups(scored_data, max_token_len=limit):
            await self.add_rollouts_for_wandb(group, item)
            if do_send_to_api and self._submit is not None:
                self._submit(group)

    async def wandb_log(self, wandb_metrics: dict[str, Any] | None = None) -> None:
        """Log ``wandb_metrics`` and the env's own: lengths, scores, rollouts, timings, servers."""
        metrics = dict(wandb_metrics or {})
        metrics = await self.create_rollout_table(metrics)
        self.rollouts_for_wandb = []
        metrics.update(self.stats.drain())
        prefix = self.wandb_prepend or self.config.wandb_name or self.name
        if prefix:
            metrics = {f"{prefix}/{key}": value for key, value in metrics.items()}
        metrics.update(self.server.metrics())
        self.tracker.log(metrics, step=self.curr_step)

    async def evaluate_log(
        self,
        metrics: dict[str, Any],
        task_name: str | None = None,
        model_name: str | None = None,
        start_time: float | None = None,
        end_time: float | None = None,
        generation_parameters: dict[str, Any] | None = None,
        samples: list[dict[str, Any]] | None = None,
        verbose: bool = True,
    ) -> None:
        """Write metrics.json (and samples.jsonl) to ``data_dir_to_save_evals``; log them."""
        self.last_eval_metrics = dict(metrics)
        self.last_eval_samples = list(samples or [])
        self.tracker.log({f"eval/{k}": v for k, v in metrics.items()}, step=self.curr_step)
        if self.config.data_dir_to_save_evals is None:
            return
        write_eval_results(
            self.config.data_dir_to_save_evals,
            metrics=metrics,
            task_name=task_name or f"{self.name or type(self).__name__}_eval",
            model_name=model_name or self.server.servers[0].config.model_name,
            seconds=(end_time or time.time()) - (start_time or time.time()),
            generation_parameters={
                "max_new_tokens": self.config.max_token_length,
                **(generation_parameters or {}),
            },
            samples=samples,
        )

    @classmethod
    def cli(cls) -> None:
        """``python my_env.py serve|process|evaluate [--env.<field> ...]``."""
        from atroposlib.envs.cli import run_cli

        run_cli(cls)

    # ---- used by the runner and the modes -------------------------------------------

    def tokenizer_or_none(self) -> Any:
        return self._tokenizer

    def attach_registration(self, answer: EnvRegistrationResponse) -> None:
        self.env_id = answer.env_id
        self.wandb_prepend = answer.wandb_name
        self.curr_step = answer.starting_step
        self.checkpoint_dir = answer.checkpoint_dir
        self.checkpoint_interval = answer.checkpoint_interval
        self.broker_num_steps = answer.num_steps

    def start_tracker(self, *, project: str | None, group: str | None) -> None:
        self.tracker = make_tracker(
            self.config.use_wandb,
            project=project,
            group=group,
            name=self.wandb_prepend or self.config.wandb_name or self.name,
            config=self.config.model_dump(mode="json"),
        )

    async def next_item(self) -> Item:
        if self.backlog:
            return self.backlog.pop()
        return await self.get_next_item()

    async def run_item(
        self, item: Item, *, max_token_len: int | None = None
    ) -> list[dict[str, Any]]:
        """Roll out ``item`` and return the groups fit to send; failures are logged and counted."""
        started = time.perf_counter()
        try:
            trajectories, extra = await self.collect_trajectories(item)
            self.backlog.extend(extra)
            trajectories = await self.postprocess_histories(trajectories)
        except InferenceUnavailableError as exc:
            logger.warning("rollout postponed, inference unavailable: %s", exc)
            self.backlog.append(item)
            self.perf.record(time.perf_counter() - started, ok=False)
            return []
        except Exception:
            logger.exception("rollout of item failed in %s", type(self).__name__)
            self.perf.record(time.perf_counter() - started, ok=False)
            return []
        finally:
            await self.cleanup()
        groups = self.accept_groups(trajectories, max_token_len=max_token_len)
        for group in groups:
            await self.add_rollouts_for_wandb(group, item)
        self.perf.record(time.perf_counter() - started, ok=bool(groups))
        return groups

    def accept_groups(
        self, trajectories: Trajectories, *, max_token_len: int | None = None
    ) -> list[dict[str, Any]]:
        """Validate groups (an Atropos dict becomes ``ScoredData`` here, once) and return their
        wire form; each rejection is logged with its reason and counted."""
        if trajectories is None:
            return []
        candidates: list[Any] = (
            [trajectories] if isinstance(trajectories, dict | ScoredData) else list(trajectories)
        )
        limit = self.max_token_len if max_token_len is None else max_token_len
        accepted: list[dict[str, Any]] = []
        for candidate in candidates:
            if candidate is None:
                continue
            try:
                group, payload = checked_wire_form(candidate)
            except ValidationError as exc:
                invalid = invalid_group_reason(exc)
                logger.warning("group not sent: %s", invalid)
                self.perf.rejected[invalid.split(":")[0][:40]] += 1
                continue
            reason = group_rejection_reason(
                group,
                group_size=self.config.group_size,
                max_token_len=limit,
                ensure_scores_are_not_same=self.config.ensure_scores_are_not_same,
            )
            if reason is not None:
                logger.warning("group not sent: %s", reason)
                self.perf.rejected[reason.split(":")[0][:40]] += 1
                continue
            if self.config.include_messages and payload.get("messages") is None and self._tokenizer:
                payload["messages"] = [
                    [{"role": "assistant", "content": self._tokenizer.decode(seq)}]
                    for seq in payload["tokens"]
                ]
            self.stats.observe(payload)
            self.items_sent_this_step += 1
            accepted.append(payload)
        return accepted

    async def run_evaluate(self) -> None:
        try:
            await self.evaluate()
        except Exception:
            logger.exception("evaluate() failed")
