"""Atropos 0.4's stand-alone evaluation helpers: ``EvalBase``, ``eval_runner``, ``pass_at_k``."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from abc import ABC, abstractmethod
from typing import Any

from pydantic import Field

from atroposlib.envs.evaluation import write_eval_results
from atroposlib.envs.reward_fns.code_rewards import pass_at_k as _pass_at_k
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.utils.cli import parse_command_line
from atroposlib.utils.cli_settings import CommandLineSettings

logger = logging.getLogger(__name__)


def pass_at_k(m: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``m`` samples of which ``c`` are correct.

    >>> round(pass_at_k(10, 3, 5), 4)
    0.9167
    """
    return _pass_at_k(m, c, k)


def evaluate_log(
    metrics: dict[str, Any],
    eval_dir: str | None = None,
    task_name: str | None = None,
    model_name: str | None = None,
    start_time: float | None = None,
    end_time: float | None = None,
    generation_parameters: dict[str, Any] | None = None,
    samples: list[dict[str, Any]] | None = None,
    verbose: bool = True,
) -> None:
    """Write ``metrics.json`` (and ``samples.jsonl``) to ``eval_dir``; nothing without one."""
    if eval_dir is None:
        logger.warning("eval_dir is not set: evaluation results are not written")
        return
    now = time.time()
    started, ended = start_time or now, end_time or now
    if verbose:
        from atroposlib.utils.display import display_metrics_table

        display_metrics_table(task_name, metrics, started, ended)
    write_eval_results(
        eval_dir, metrics=metrics, task_name=str(task_name), model_name=str(model_name),
        seconds=ended - started, generation_parameters=generation_parameters or {},
        samples=samples,
    )  # fmt: skip


class EvalBase(ABC):
    """An evaluation over ``setup_data()``; ``run_item`` returns (metrics dict, sample)."""

    def __init__(self, pass_at_n: int = 1, pass_at_n_samples: int = 1, **kwargs: Any) -> None:
        self.pass_at_n = pass_at_n
        self.pass_at_n_samples = pass_at_n_samples
        for key, value in kwargs.items():
            setattr(self, key, value)
        self.data = self.setup_data()

    def get_generation_params(self) -> dict[str, Any]:
        return {
            "temperature": getattr(self, "temperature", 0.0),
            "n": max(self.pass_at_n_samples, self.pass_at_n),
            "top_p": getattr(self, "top_p", 1.0),
            "max_tokens": getattr(self, "max_tokens", -1),
        }

    async def chat_completion(self, server: Any, messages: list[dict[str, Any]]) -> Any:
        return await server.chat_completion(messages=messages, **self.get_generation_params())

    @abstractmethod
    def setup_data(self) -> list[Any]:
        """The items to evaluate."""

    @abstractmethod
    async def run_item(self, server: ServerManager, data_item: Any) -> tuple[dict[str, Any], Any]:
        """Evaluate one item: (metrics, sample)."""

    def task_name(self) -> str:
        name = f"{type(self).__name__}@{self.pass_at_n}"
        if self.pass_at_n != self.pass_at_n_samples:
            name += f":{self.pass_at_n_samples}"
        return name

    async def __call__(self, server_manager: ServerManager) -> dict[str, float]:
        started = time.time()
        results = await asyncio.gather(*(self.run_item(server_manager, d) for d in self.data))
        ended = time.time()
        per_item = [metrics for metrics, _ in results]
        metrics = {key: sum(m[key] for m in per_item) / len(per_item) for key in per_item[0]}
        logger.info("%s metrics: %s", self.task_name(), metrics)
        evaluate_log(
            metrics, eval_dir=getattr(self, "eval_dir", None), task_name=self.task_name(),
            model_name=server_manager.servers[0].config.model_name, start_time=started,
            end_time=ended, generation_parameters=self.get_generation_params(),
            samples=[sample for _, sample in results], verbose=getattr(self, "verbose", False),
        )  # fmt: skip
        return metrics


class EvalRunnerSettings(CommandLineSettings):
    """Run one evaluation against an OpenAI-compatible inference server."""

    server_url: str = Field(
        "http://localhost:8000", description="OpenAI-compatible base URL of the inference server."
    )
    model_name: str = Field("default", description="Model name to request.")


async def eval_runner(eval_env: EvalBase, argv: list[str] | None = None) -> dict[str, float]:
    """``--server-url`` and ``--model-name`` from the command line, then run ``eval_env``."""
    from atroposlib.envs.server_handling.server_baseline import APIServerConfig

    args = parse_command_line(EvalRunnerSettings, argv, os.path.basename(sys.argv[0]))
    manager = ServerManager([APIServerConfig(api_key="dummy", base_url=args.server_url,
                                             model_name=args.model_name or "default",
                                             health_check=False)])  # fmt: skip
    try:
        return await eval_env(manager)
    finally:
        await manager.close()
