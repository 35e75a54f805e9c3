"""Adapters that run environments of other ecosystems on our loop.

``verifiers_env`` runs a verifiers (v1) environment, ``openenv_env`` plays episodes against an
OpenEnv server; both sample token-in/token-out through ``atroposlib.envs.rollouts`` and
post typed groups (``atroposlib.group.ScoredData``).
"""

import asyncio
import contextlib
from typing import TypeVar

from atroposlib.envs.config import BaseEnvConfig
from atroposlib.envs.server_handling.server_baseline import APIServerConfig

ConfigT = TypeVar("ConfigT", bound=BaseEnvConfig)


def local_defaults(config_cls: type[ConfigT]) -> tuple[ConfigT, list[APIServerConfig]]:
    """An adapter's defaults: the small model's tokenizer, a local token-id server."""
    config = config_cls(
        tokenizer_name="HuggingFaceTB/SmolLM2-135M-Instruct",
        group_size=8,
        max_token_length=2048,
        steps_per_eval=0,
    )
    server = APIServerConfig(
        model_name="default", base_url="http://localhost:9001/v1", server_type="embedded"
    )
    return config, [server]


async def stop(task: asyncio.Task[None] | None) -> None:
    """Cancel a task ``setup()`` started to hold a resource, and wait for its teardown."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
