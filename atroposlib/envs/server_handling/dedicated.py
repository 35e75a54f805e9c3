"""``ServerManager.dedicated_server()``: one server pinned for a whole multi-turn episode.

Pinning keeps an episode's requests on one server, so its prefix cache is reused turn after
turn. The pinned server holds one training slot while the episode runs; its requests still
get the manager's retries and circuit breaker, but never move to another server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from openai.types import Completion
from openai.types.chat import ChatCompletion

from atroposlib.envs.server_handling.server_baseline import APIServer, GeneratedSequence


class PinnedCaller(Protocol):
    """What a dedicated server needs of its manager (``ServerManager.call_on``)."""

    async def call_on(
        self, split: str, op: Callable[[APIServer], Awaitable[Any]], servers: Sequence[APIServer]
    ) -> Any: ...


class DedicatedServer:
    """The calls of an ``APIServer``, sent to one server through the manager."""

    def __init__(self, manager: PinnedCaller, server: APIServer) -> None:
        self.manager = manager
        self.server = server

    def __getattr__(self, name: str) -> Any:  # config, tokenizer, metrics, ...
        return getattr(self.server, name)

    async def _pinned(
        self, kwargs: dict[str, Any], op: Callable[[APIServer], Awaitable[Any]]
    ) -> Any:
        split = "eval" if kwargs.get("split", "train") != "train" else "train"
        return await self.manager.call_on(split, op, [self.server])

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        return await self._pinned(kwargs, lambda server: server.chat_completion(**kwargs))

    async def completion(self, **kwargs: Any) -> Completion:
        return await self._pinned(kwargs, lambda server: server.completion(**kwargs))

    async def generate(
        self, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]:
        return await self._pinned(sampling, lambda s: s.generate(input_ids, n, sampling))

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> Any:
        return await self._pinned(kwargs, lambda s: s.tokens_and_logprobs_completion(**kwargs))
