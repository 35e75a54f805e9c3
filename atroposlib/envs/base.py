"""``BaseEnv``: the class environment authors subclass (Atropos 0.4 hooks and names).

Over 500 lines because it is Atropos's whole subclassing surface, kept on the one class.

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
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import ValidationError

from atroposlib.envs import checkpointing
from atroposlib.envs.config import BaseEnvConfig, EvalHandlingEnum
from atroposlib.envs.constants import ENV_NAMESPACE, NAMESPACE_SEP, OPENAI_NAMESPACE
from atroposlib.envs.evaluation import write_eval_results
from atroposlib.envs.groups import (
    ScoredDataGroup,
    ScoredDataItem,
    group_from_items,
    group_rejection_reason,
    is_no_signal,
    is_over_budget,
)
from atroposlib.envs.optional_fields import RepairNotices, repair_optional_fields
from atroposlib.envs.rollouts import TokenSampler
from atroposlib.envs.server_handling.openai_server import resolve_openai_configs
from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    ReasoningConfig,
    ServerBaseline,
)
from atroposlib.envs.server_handling.server_manager import ServerManager, ServerManagerConfig
from atroposlib.envs.stats import RolloutStats
from atroposlib.envs.tracking import NullTracker, Tracker, make_tracker
from atroposlib.errors import InferenceEngineDeadError, InferenceUnavailableError
from atroposlib.frontend.jsonl2html import generate_html
from atroposlib.group import ScoredData, checked_wire_form, invalid_group_reason
from atroposlib.type_definitions import UUID, Item, Message
from atroposlib.utils.io import parse_http_response
from atroposlib.utils.metrics import get_std_min_max_avg
from atroposlib.utils.tokenize_for_trainer import with_list_chat_template
from atroposlib.wire.broker import EnvRegistrationResponse, EnvStatusResponse

logger = logging.getLogger(__name__)

__all__ = [
    "ENV_NAMESPACE",
    "NAMESPACE_SEP",
    "OPENAI_NAMESPACE",
    "UUID",
    "APIServer",
    "APIServerConfig",
    "BaseEnv",
    "BaseEnvConfig",
    "EvalHandlingEnum",
    "Item",
    "Message",
    "ReasoningConfig",
    "ScoredDataGroup",
    "ScoredDataItem",
    "ServerBaseline",
    "ServerManager",
    "ServerManagerConfig",
    "generate_html",
    "get_std_min_max_avg",
    "parse_http_response",
    "resolve_openai_configs",
]

Group = ScoredData | ScoredDataGroup
Trajectories = Group | Sequence[Group | None] | None
ATROPOS_NULL_KEYS = (
    "ref_logprobs", "overrides", "group_overrides", "distill_token_ids", "distill_logprobs",
)  # fmt: skip
"""Keys Atropos 0.4 always wrote (null when the env set none), in JSONL and to the broker."""


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
            server_configs,
            server_class=self.server_cls,
            slurm=slurm,
            testing=testing,
            reasoning_config=ReasoningConfig.from_env_config(config),
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
        self.repair_notices = RepairNotices()
        self._submit: Callable[[dict[str, Any]], None] | None = None
        self._on_step: Callable[[int], Awaitable[None]] | None = None
        self._tokenizer: Any = None
        self.last_failure: str | None = None
        self.last_rollout_raised = False
        self.status_dict: dict[str, Any] = {}
        """The last ``/status-env`` answer (``current_step``, ``queue_size``, ...)."""

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

            tokenizer = AutoTokenizer.from_pretrained(self.config.tokenizer_name)
            self._tokenizer = with_list_chat_template(tokenizer)
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self._tokenizer = value

    def token_sampler(
        self, *, max_tokens: int | None = None, temperature: float | None = None, **sampling: Any
    ) -> TokenSampler:
        """Token-in/token-out sampling on this env's servers (see ``atroposlib.envs.rollouts``).

        Defaults: the config's ``max_completion_tokens`` (a config without one: replies fill
        the room ``max_token_length`` leaves after the prompt) and ``temperature`` (else 1.0).
        """
        if max_tokens is None:
            max_tokens = getattr(self.config, "max_completion_tokens", None)
        if max_tokens is None:
            max_tokens = self.config.max_token_length
            sampling.setdefault("max_token_length", self.config.max_token_length)
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

    def perf_stats(self, metrics_dict: dict[str, Any]) -> dict[str, Any]:
        """Add the rollout timings since the last log (``perf/...``) to ``metrics_dict``."""
        metrics_dict.update(self.perf.drain())
        return metrics_dict

    async def env_step_checks(self) -> None:
        """Called by ``serve`` after each ``/status-env``; starts evals, saves checkpoints and
        logs when the trainer's step moved. Override to add your own (call super)."""
        step = int(self.status_dict.get("current_step", self.curr_step))
        if self._on_step is not None:
            await self._on_step(step)
        else:
            self.curr_step = step

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
            seconds=_elapsed(start_time, end_time),
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

    def attach_runner(
        self,
        submit: Callable[[dict[str, Any]], None],
        on_step: Callable[[int], Awaitable[None]],
    ) -> None:
        """``serve`` hands its sender and step hook to the env (``handle_send_to_api`` uses
        ``submit``; ``env_step_checks`` calls ``on_step`` with the trainer's new step)."""
        self._submit = submit
        self._on_step = on_step

    def start_tracker(
        self, *, project: str | None, group: str | None, run_name: str | None = None
    ) -> None:
        self.tracker = make_tracker(
            self.config.use_wandb,
            project=project,
            group=group,
            name=run_name or self.wandb_prepend or self.config.wandb_name or self.name,
            config=self.config.model_dump(mode="json"),
        )

    async def next_item(self) -> Item:
        if self.backlog:
            return self.backlog.pop()
        return await self.get_next_item()

    async def run_item(
        self,
        item: Item,
        *,
        max_token_len: int | None = None,
        dropped: list[dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        """Roll out ``item`` and return the groups fit to send; failures are logged and counted
        (``last_failure`` says why, ``last_rollout_raised`` whether it was an exception; both
        set just before returning: safe with concurrent items). Well-formed groups left out
        because their scores are all equal or a sequence is over ``max_token_len`` go to
        ``dropped``, when given, with the reason in ``"dropped"`` (``serve`` writes them to
        its group file so the dump stays complete)."""
        started = time.perf_counter()
        failure: str | None = None
        raised = False
        try:
            trajectories, extra = await self.collect_trajectories(item)
            self.backlog.extend(extra or [])
            trajectories = await self.postprocess_histories(trajectories)
        except InferenceEngineDeadError:
            raise  # no server can sample any more: the run stops (the CLI says why)
        except InferenceUnavailableError as exc:
            logger.warning("rollout postponed, inference unavailable: %s", exc)
            self.backlog.append(item)
            trajectories, failure = None, f"inference unavailable: {exc}"
            raised = True
        except Exception as exc:
            logger.exception("rollout of item failed in %s", type(self).__name__)
            trajectories = None
            failure = f"{type(exc).__name__} in collect_trajectories: {exc}"
            raised = True
        finally:
            await self.cleanup()
        if trajectories is None:  # whatever error an env or adapter made of a dead engine
            self._raise_if_no_engine_left()
        self.last_failure = None
        groups = self.accept_groups(
            trajectories, max_token_len=max_token_len, item=item, dropped=dropped
        )
        failure = failure or self.last_failure
        for group in groups:
            await self.add_rollouts_for_wandb(group, item)
        self.perf.record(time.perf_counter() - started, ok=bool(groups))
        self.last_failure = None if groups else failure or "collect_trajectories gave no group"
        self.last_rollout_raised = not groups and raised
        return groups

    def _raise_if_no_engine_left(self) -> None:
        """Stop the run when every inference engine is dead: retrying items would fail forever."""
        reason = getattr(self.server, "dead_reason", None)
        if isinstance(reason, str):
            raise InferenceEngineDeadError(reason)

    def accept_groups(
        self,
        trajectories: Trajectories,
        *,
        max_token_len: int | None = None,
        item: Item = None,
        dropped: list[dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        """Validate groups (an Atropos dict becomes ``ScoredData`` here, once) and return their
        wire form, with Atropos's keys; each rejection (a malformed group included) is logged
        with its reason and the item, counted, and skipped. ``max_token_len=-1`` (``process``)
        accepts any length and groups with nothing to train, as Atropos wrote them.
        ``dropped`` (when given) receives the wire form of each well-formed group rejected
        for ``ensure_scores_are_not_same`` or a sequence over the token budget, its reason
        under ``"dropped"``."""
        if trajectories is None:
            return []
        if isinstance(trajectories, dict | ScoredData):
            candidates: list[Any] = [trajectories]
        elif isinstance(trajectories, list | tuple):
            candidates = list(trajectories)
        else:
            candidates = [trajectories]
        limit = self.max_token_len if max_token_len is None else max_token_len
        accepted: list[dict[str, Any]] = []
        for candidate in candidates:
            if candidate is None:
                continue
            payload, reason = self._checked(candidate, limit, require_trained=max_token_len != -1)
            if reason is not None:
                quiet = False  # a group without signal is routine; one too long is news
                dumped = is_no_signal(reason) or is_over_budget(reason)
                if payload is not None and dropped is not None and dumped:
                    dropped.append({**payload, "dropped": reason})
                    quiet = is_no_signal(reason)
                if quiet:
                    logger.debug("group dropped: %s", reason)
                else:
                    logger.warning("group not sent: %s (item: %.300r)", reason, item)
                self.perf.rejected[reason.split(":")[0][:40]] += 1
                self.last_failure = f"group rejected: {reason}"
                continue
            assert payload is not None
            for key in ATROPOS_NULL_KEYS:
                payload.setdefault(key, None)
            if self._decodes_messages(payload):
                payload["messages"] = [
                    [{"role": "user", "content": self._tokenizer.decode(seq)}]
                    for seq in payload["tokens"]
                ]
            self.stats.observe(payload)
            self.items_sent_this_step += 1
            accepted.append(payload)
        return accepted

    @property
    def aggregates_rollouts(self) -> bool:
        """Whether groups are stacked from single rollouts (``collect_trajectory``) by the
        default ``collect_trajectories``."""
        return type(self).collect_trajectories is BaseEnv.collect_trajectories

    def _decodes_messages(self, payload: dict[str, Any]) -> bool:
        """``include_messages`` fills a group without messages with its decoded sequences, as
        Atropos did (``user`` turns), except a stacked one (Atropos left ``[]`` there)."""
        return bool(
            self.config.include_messages and payload.get("messages") is None
            and self._tokenizer is not None and not self.aggregates_rollouts
        )  # fmt: skip

    def _checked(
        self, candidate: Any, max_token_len: int, require_trained: bool
    ) -> tuple[dict[str, Any] | None, str | None]:
        """The group's wire form (None when malformed) and why it must not be sent (None:
        it may)."""
        if not isinstance(candidate, dict | ScoredData):
            return None, f"malformed group: a {type(candidate).__name__}, not a dict"
        try:
            group, payload = checked_wire_form(candidate)
        except ValidationError as exc:
            # messages / extra in another shape cost the field, never the group
            repaired = repair_optional_fields(candidate) if isinstance(candidate, dict) else None
            if repaired is None:
                return None, f"malformed group: {invalid_group_reason(exc)}"
            try:
                group, payload = checked_wire_form(repaired.group)
            except ValidationError as still:
                return None, f"malformed group: {invalid_group_reason(still)}"
            self.repair_notices.announce(repaired)
        reason = group_rejection_reason(
            group,
            group_size=self.config.group_size,
            max_token_len=max_token_len,
            ensure_scores_are_not_same=self.config.ensure_scores_are_not_same,
            require_trained_tokens=require_trained,
        )
        return payload, reason

    async def run_evaluate(self) -> None:
        try:
            await self.evaluate()
        except Exception:
            logger.exception("evaluate() failed")


def _elapsed(start_time: float | None, end_time: float | None) -> float:
    """Seconds an evaluation took; a bound not given is now (0.0 is a time, not "not given")."""
    now = time.time()
    return (now if end_time is None else end_time) - (now if start_time is None else start_time)
