"""The three commands: ``serve`` (broker), ``process`` (JSONL + HTML), ``evaluate``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx
import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from atroposlib.envs.storage import free_path
from atroposlib.errors import BrokerRejectedError, ConfigError
from atroposlib.utils.html_report import render_groups_html

if TYPE_CHECKING:
    from atroposlib.envs.base import BaseEnv

logger = logging.getLogger(__name__)


def _env_name(env_cls: type[BaseEnv]) -> str:
    return env_cls.name or env_cls.__name__


COMMAND_DEFAULTS: dict[str, Callable[[type[BaseEnv]], dict[str, Any]]] = {
    "serve": lambda cls: {},
    "process": lambda cls: {
        "total_steps": 2,
        "ensure_scores_are_not_same": False,
        "include_messages": True,
        "use_wandb": False,
        "data_path_to_save_groups": f"data/{_env_name(cls)}.jsonl",
    },
    "evaluate": lambda cls: {
        "use_wandb": False,
        "data_dir_to_save_evals": f"eval_results/{_env_name(cls)}",
    },
}


async def broker_encoding(url: str) -> Literal["msgpack", "json"]:
    """msgpack for our broker (it has ``/health``), JSON for an Atropos 0.4 one."""
    try:
        async with httpx.AsyncClient(timeout=5.0) as http:
            answer = await http.get(f"{url.rstrip('/')}/health")
    except httpx.HTTPError:
        return "msgpack"
    return "msgpack" if answer.status_code in (200, 401) else "json"


async def serve(env: BaseEnv) -> None:
    from atroposlib.api.client import EnvClient
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


def _for_report(env: BaseEnv, group: dict[str, Any]) -> dict[str, Any]:
    if group.get("messages") or env.tokenizer_or_none() is None:
        return group
    texts = [env.tokenizer_or_none().decode(tokens) for tokens in group["tokens"]]
    return {**group, "messages": [[{"role": "text", "content": t}] for t in texts]}


async def process(env: BaseEnv) -> list[dict[str, Any]]:
    """Generate ``total_steps`` groups, write them to JSONL and an HTML report."""
    config = env.config
    await env.setup()
    target = config.total_steps
    path = free_path(Path(config.data_path_to_save_groups or "data/groups.jsonl"))
    path.parent.mkdir(parents=True, exist_ok=True)
    groups: list[dict[str, Any]] = []
    scores: list[float] = []
    started = time.perf_counter()
    concurrency = max(1, min(env.max_num_workers, target))
    attempts_left = max(10, target * 5)
    with path.open("wb") as jsonl, _progress() as progress:
        bar = progress.add_task("groups", total=target, rate=0.0, mean=float("nan"))
        while len(groups) < target and attempts_left > 0:
            want = min(concurrency, target - len(groups), attempts_left)
            items = [await env.next_item() for _ in range(want)]
            items = [item for item in items if item is not None]
            if not items:
                logger.info("get_next_item returned None: no more items")
                break
            attempts_left -= len(items)
            for batch in await asyncio.gather(*(env.run_item(i, max_token_len=-1) for i in items)):
                for group in batch[: target - len(groups)]:
                    group = _for_report(env, group)
                    jsonl.write(orjson.dumps(group) + b"\n")
                    groups.append(group)
                    scores.extend(float(s) for s in group["scores"])
            elapsed = max(1e-9, time.perf_counter() - started)
            mean = sum(scores) / len(scores) if scores else float("nan")
            progress.update(bar, completed=len(groups), rate=len(groups) / elapsed, mean=mean)
    html_path = path.with_suffix(".html")
    html_path.write_text(
        render_groups_html(groups, title=f"{env.name or type(env).__name__}: {path.name}")
    )
    logger.info("wrote %d groups to %s and %s", len(groups), path, html_path)
    if len(groups) < target:
        logger.warning("only %d of %d groups could be generated", len(groups), target)
    await env.server.close()
    return groups


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:.2f} groups/s"),
        TextColumn("mean score {task.fields[mean]:.3f}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


async def evaluate(env: BaseEnv) -> dict[str, Any]:
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
