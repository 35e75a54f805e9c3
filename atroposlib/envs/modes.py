"""The three commands: ``serve`` (broker), ``process`` (JSONL + HTML), ``evaluate``."""

from __future__ import annotations

import asyncio
import logging
import random
import string
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from atroposlib.envs.atropos_output import atropos_row, jsonl_line
from atroposlib.envs.storage import free_path
from atroposlib.errors import BrokerRejectedError, ConfigError
from atroposlib.utils.html_report import render_groups_html

if TYPE_CHECKING:
    from atroposlib.envs.served import ServedEnv

logger = logging.getLogger(__name__)


def _env_name(env_cls: type[ServedEnv]) -> str:
    return env_cls.name or env_cls.__name__


async def broker_encoding(url: str) -> Literal["msgpack", "json"]:
    """msgpack for our broker (it has ``/health``), JSON for an Atropos 0.4 one."""
    try:
        async with httpx.AsyncClient(timeout=5.0) as http:
            answer = await http.get(f"{url.rstrip('/')}/health")
    except httpx.HTTPError:
        return "msgpack"
    return "msgpack" if answer.status_code in (200, 401) else "json"


async def serve(env: ServedEnv) -> None:
    from atroposlib.client import EnvClient
    from atroposlib.envs.runner import EnvRunner

    url, secret = env.config.rollout_server_url, env.config.rollout_server_api_key
    api_key = secret.get_secret_value() if secret is not None else None
    encoding = await broker_encoding(url)
    env.serving = True
    try:
        async with EnvClient(url, api_key, max_retries=3, encoding=encoding) as client:
            await EnvRunner(env, client).run()
    except BrokerRejectedError as exc:
        if exc.status_code != 401:
            raise
        raise ConfigError(unauthorized_reason(url, api_key is not None)) from exc
    finally:
        await env.server.close()


def unauthorized_reason(url: str, sent_a_key: bool) -> str:
    """What to do when the broker answers 401 (retrying cannot help, so the env stops)."""
    problem = "refused the API key this env sent" if sent_a_key else "requires an API key"
    return (
        f"the broker at {url} {problem} (401); set ATROPOS_API_KEY or "
        "--env.rollout_server_api_key to the key run-api was started with"
    )


def _for_report(env: ServedEnv, group: dict[str, Any]) -> dict[str, Any]:
    """A row of the HTML report: the group, its sequences decoded when it has no messages."""
    if group.get("messages") or env.tokenizer_or_none() is None:
        return {"messages": None, **group}
    texts = [env.tokenizer_or_none().decode(tokens) for tokens in group["tokens"]]
    return {**group, "messages": [[{"role": "text", "content": t}] for t in texts]}


def _process_run_name(env: ServedEnv) -> str:
    """Atropos's wandb run name for ``process``: ``<env>-<date>-<6 random letters>``."""
    suffix = "".join(random.choices(string.ascii_lowercase, k=6))
    return f"{env.name or type(env).__name__}-{datetime.now():%Y-%m-%d}-{suffix}"


ATTEMPTS_PER_ITEM = 3
"""How often ``process`` rolls out one item before it gives that item up."""
RAISED_IN_A_ROW = 15
"""``process`` stops after this many rollouts in a row raised: an env or server fault, not the
bad luck its budget waits out."""
ATTEMPTS_FLAG = "--env.process_max_attempts_without_group"
MINUTES_FLAG = "--env.process_max_minutes_without_group"


_Outcome = tuple[list[dict[str, Any]], str | None, bool]
"""One rollout in ``process``: its groups, why it gave none, whether it raised."""


class ProcessFailedError(ConfigError):
    """``process`` could not write a single group (the CLI exits 1 with this one line)."""


@dataclass
class _ProcessState:
    target: int
    started_at: float
    rows: list[dict[str, Any]] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    attempts: dict[int, int] = field(default_factory=dict)
    retry: list[tuple[int, Any]] = field(default_factory=list)
    given_up: int = 0
    tried: int = 0
    rollouts: int = 0
    rollouts_without_group: int = 0
    raised_in_a_row: int = 0
    last_group_at: float = 0.0
    last_failure: str | None = None
    stopped_by: str | None = None
    """Why the loop ended before ``target`` groups: the budget spent (naming its flag), or
    the env's items running out."""

    @property
    def missing(self) -> int:
        return self.target - len(self.rows)


@dataclass(frozen=True)
class ProcessBudget:
    """How long ``process`` keeps trying without a written group (-1: no limit)."""

    rollouts: int
    minutes: float

    def rollouts_left(self, state: _ProcessState) -> int | None:
        return None if self.rollouts == -1 else self.rollouts - state.rollouts_without_group

    def why_stop(self, state: _ProcessState, now: float) -> str | None:
        """Why ``process`` should stop now (a spent budget names its flag), or ``None``."""
        if state.raised_in_a_row >= RAISED_IN_A_ROW:
            return f"{state.raised_in_a_row} rollouts in a row raised an error (see the log)"
        if self.rollouts != -1 and state.rollouts_without_group >= self.rollouts:
            return (f"{state.rollouts_without_group} rollouts in a row wrote no group "
                    f"({ATTEMPTS_FLAG} {self.rollouts}; raise it to keep trying)")  # fmt: skip
        waited = (now - state.last_group_at) / 60
        if self.minutes != -1 and waited >= self.minutes:
            return (f"{waited:.1f} minutes without a written group "
                    f"({MINUTES_FLAG} {self.minutes:g}; raise it to keep trying)")  # fmt: skip
        return None


async def _next_items(env: ServedEnv, state: _ProcessState, want: int) -> list[tuple[int, Any]]:
    """Items to roll out now: those waiting for another attempt first, then new ones."""
    batch = state.retry[:want]
    del state.retry[:want]
    while len(batch) < want:
        item = await env.next_item()
        if item is None:
            break
        state.tried += 1
        batch.append((state.tried, item))
    return batch


def _settle(state: _ProcessState, key: int, item: Any, outcome: _Outcome) -> None:
    groups, failure, raised = outcome
    state.rollouts += 1
    state.raised_in_a_row = state.raised_in_a_row + 1 if raised else 0
    if groups:
        return
    state.rollouts_without_group += 1
    state.last_failure = failure or state.last_failure
    state.attempts[key] = state.attempts.get(key, 0) + 1
    if state.attempts[key] < ATTEMPTS_PER_ITEM:
        state.retry.append((key, item))
        return
    state.given_up += 1
    logger.warning("item gave no group in %d attempts, skipped (last: %s): %.300r",
                   ATTEMPTS_PER_ITEM, failure, item)  # fmt: skip


def _batch_size(state: _ProcessState, budget: ProcessBudget, concurrency: int) -> int:
    """One rollout per missing group while rollouts give groups; every worker once they stop
    (a small model may need hundreds of tries: the engine batches them for about one's time)."""
    want = min(concurrency, state.missing if state.rollouts_without_group == 0 else concurrency)
    left = budget.rollouts_left(state)
    return max(1, want if left is None else min(want, left))


async def process(
    env: ServedEnv, *, clock: Callable[[], float] = time.monotonic
) -> list[dict[str, Any]]:
    """Write ``total_steps`` groups to JSONL and an HTML report.

    Each item gets up to ``ATTEMPTS_PER_ITEM`` rollouts. It keeps trying while the budget
    lasts (``process_max_attempts_without_group`` rollouts in a row, or
    ``process_max_minutes_without_group`` minutes, without a written group) and the env has
    items. Rows carry Atropos's keys (nulls included). Raises ``ProcessFailedError`` with the
    one-line reason when not one group was written.
    """
    config = env.config
    await env.setup()
    budget = ProcessBudget(
        rollouts=config.process_max_attempts_without_group,
        minutes=config.process_max_minutes_without_group,
    )
    state = _ProcessState(target=config.total_steps, started_at=clock(), last_group_at=clock())
    path = free_path(Path(config.data_path_to_save_groups or "data/groups.jsonl"))
    path.parent.mkdir(parents=True, exist_ok=True)
    concurrency = max(1, env.max_num_workers)
    env.start_tracker(project=None, group=None, run_name=_process_run_name(env))
    env.curr_step = 0
    with path.open("wb") as jsonl, _progress() as progress:
        bar = progress.add_task("groups", total=state.target, rate=0.0, mean=float("nan"),
                                rollouts=0)  # fmt: skip
        while state.missing > 0:
            state.stopped_by = budget.why_stop(state, clock())
            if state.stopped_by is not None:
                break
            batch = await _next_items(env, state, _batch_size(state, budget, concurrency))
            if not batch:
                state.stopped_by = "get_next_item returned None: the env has no more items"
                logger.info(state.stopped_by)
                break
            outcomes = await asyncio.gather(*(_roll_out(env, item) for _, item in batch))
            for (key, item), outcome in zip(batch, outcomes, strict=True):
                for group in outcome[0][: state.missing]:
                    row = atropos_row(group, aggregated=env.aggregates_rollouts)
                    jsonl.write(jsonl_line(row))
                    jsonl.flush()
                    state.rows.append(_for_report(env, group))
                    state.scores.extend(float(s) for s in row["scores"])
                    state.rollouts_without_group, state.last_group_at = 0, clock()
                    await env.wandb_log()  # per group, as Atropos: an env's own metrics
                    env.curr_step += 1
                _settle(state, key, item, outcome)
            elapsed = max(1e-9, clock() - state.started_at)
            mean = sum(state.scores) / len(state.scores) if state.scores else float("nan")
            progress.update(bar, completed=len(state.rows), rate=len(state.rows) / elapsed,
                            mean=mean, rollouts=state.rollouts)  # fmt: skip
    await env.server.close()
    env.tracker.finish()
    return _finish_process(env, state, path)


async def _roll_out(env: ServedEnv, item: Any) -> _Outcome:
    groups = await env.run_item(item, max_token_len=-1)
    return groups, env.last_failure, env.last_rollout_raised


def _finish_process(env: ServedEnv, state: _ProcessState, path: Path) -> list[dict[str, Any]]:
    if not state.rows:
        path.unlink(missing_ok=True)
        raise ProcessFailedError(
            f"process wrote no group: {state.stopped_by}; {state.rollouts} rollouts of "
            f"{state.tried} items; last failure: {state.last_failure or 'none'}"
        )
    html_path = path.with_suffix(".html")
    title = f"{env.name or type(env).__name__}: {path.name}"
    html_path.write_text(render_groups_html(state.rows, title=title))
    logger.info("wrote %d groups to %s and %s (%d rollouts)", len(state.rows), path, html_path,
                state.rollouts)  # fmt: skip
    if state.missing > 0:
        logger.warning("only %d of %d groups were written: %s; last failure: %s",
                       len(state.rows), state.target, state.stopped_by,
                       state.last_failure)  # fmt: skip
    return state.rows


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:.2f} groups/s"),
        TextColumn("mean score {task.fields[mean]:.3f}"),
        TextColumn("{task.fields[rollouts]} rollouts"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


async def evaluate(env: ServedEnv) -> dict[str, Any]:
    """Run ``evaluate()`` once; write metrics.json / samples.jsonl and print a table."""
    await env.setup()
    started = time.time()
    result = await env.evaluate()
    metrics: dict[str, Any] = getattr(env, "last_eval_metrics", None) or {}
    if not metrics and isinstance(result, dict):
        metrics = result
    if not getattr(env, "last_eval_metrics", None):
        await env.evaluate_log(metrics, start_time=started, end_time=time.time())
    table = Table(title=f"{env.name or type(env).__name__} evaluation")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in sorted(metrics.items()):
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    Console().print(table)
    if env.config.data_dir_to_save_evals:
        Console().print(f"results in {env.config.data_dir_to_save_evals}")
    await env.server.close()
    return metrics


@dataclass(frozen=True)
class Mode:
    """One command of an env's CLI: what ``--help`` says, what it runs, and the settings it
    changes from the env's defaults (the CLI, env vars and YAML still override them).

    A default replaces a value ``config_init()`` left at the field's default; those named in
    ``replaces_config_init`` replace ``config_init()``'s value too (``process`` writes 2 groups,
    as in Atropos, whatever training length ``config_init()`` sets in ``total_steps``).
    """

    summary: str
    run: Callable[[ServedEnv], Coroutine[Any, Any, Any]]
    defaults: Callable[[type[ServedEnv]], dict[str, Any]]
    replaces_config_init: frozenset[str] = frozenset()


MODES: dict[str, Mode] = {
    "serve": Mode("generate rollouts and send them to the broker (run-api)", serve, lambda cls: {}),
    "process": Mode(
        "generate groups without a broker: JSONL + HTML report",
        process,
        lambda cls: {
            "total_steps": 2,
            "ensure_scores_are_not_same": False,
            "include_messages": True,
            "use_wandb": True,
            "data_path_to_save_groups": f"data/{_env_name(cls)}.jsonl",
        },
        frozenset({"total_steps", "use_wandb"}),
    ),
    "evaluate": Mode(
        "run evaluate() once: metrics.json, samples.jsonl, a table",
        evaluate,
        lambda cls: {
            "use_wandb": True,
            "data_dir_to_save_evals": f"eval_results/{_env_name(cls)}",
        },
        frozenset({"use_wandb"}),
    ),
}
"""The commands of ``python my_env.py <command>``, declared once."""
