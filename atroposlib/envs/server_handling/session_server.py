"""One multi-turn session, one inference server: every turn of a ``managed_server()`` block
goes to the server its first turn went to, so each turn continues the prefix the server
already computed (its prefix cache) instead of prefilling the whole conversation elsewhere.
Only when that server fails (its retries spent, its engine dead, its circuit open) does the
session move, and each move is written into the metadata of every node sampled after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from atroposlib.envs.server_handling.choices import generate_all
from atroposlib.envs.server_handling.circuit import CircuitState
from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    GeneratedSequence,
    TokenAnswer,
    sample_tokens,
)
from atroposlib.errors import InferenceEngineDeadError, InferenceUnavailableError

T = TypeVar("T")

REASON_CHARS = 300
"""A move's reason is cut to this many characters (it is the failure's message)."""


class Router(Protocol):
    """What a session needs of the ServerManager."""

    @property
    def sessions_on(self) -> dict[int, int]: ...

    def split_chunks(self, n: int) -> list[int]: ...

    async def least_loaded(self, split: str, servers: Sequence[APIServer]) -> APIServer: ...

    async def call_on(
        self, split: str, op: Callable[[APIServer], Awaitable[T]], servers: Sequence[APIServer]
    ) -> T: ...

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]: ...


class SessionServer:
    """The token backend of one ``managed_server()`` block over ``servers``.

    ``server`` is the one the session samples on (None before the first turn); ``moves`` one
    ``{"turn", "from", "to", "reason"}`` per move. :meth:`node_metadata` is what the managed
    server adds to each node it records.
    """

    def __init__(self, router: Router, servers: Sequence[APIServer]) -> None:
        self.router = router
        self.servers = list(servers)
        self.server: APIServer | None = None
        self.turns = 0
        self.moves: list[dict[str, Any]] = []
        self._counted: APIServer | None = None  # the server whose open sessions count this one

    async def generate(
        self, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]:
        split = "eval" if sampling.get("split", "train") != "train" else "train"
        self.turns += 1
        server = self.server or self._pin(await self.router.least_loaded(split, self.servers))
        reason = out_of_service(server)
        if reason is None:
            try:
                return await self._on(server, split, input_ids, n, sampling)
            except (InferenceUnavailableError, InferenceEngineDeadError) as exc:
                reason = str(exc)
        others = [s for s in self.servers if s is not server]
        if not others:
            return await self._on(server, split, input_ids, n, sampling)
        moved_to = self._pin(await self.router.least_loaded(split, others))
        move = {"turn": self.turns, "from": base_url_of(server), "to": base_url_of(moved_to)}
        self.moves.append({**move, "reason": reason[:REASON_CHARS]})
        return await self._on(moved_to, split, input_ids, n, sampling)

    def _pin(self, server: APIServer) -> APIServer:
        """Sample on ``server`` from now on; the manager counts it among its open sessions."""
        self.close()
        self.server = self._counted = server
        self.router.sessions_on[id(server)] = self.router.sessions_on.get(id(server), 0) + 1
        return server

    def close(self) -> None:
        """The block is over: its server no longer counts it (a second call does nothing)."""
        if self._counted is not None:
            count = self.router.sessions_on.get(id(self._counted), 0)
            self.router.sessions_on[id(self._counted)] = max(0, count - 1)
            self._counted = None

    async def _on(
        self, server: APIServer, split: str, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]:
        """``n`` sequences from ``server`` alone, in the manager's chunks of ``n``."""

        def op(chunk: int) -> Callable[[APIServer], Awaitable[list[GeneratedSequence]]]:
            return lambda s: generate_all(s, input_ids, chunk, sampling)

        chunks = self.router.split_chunks(n)
        parts = await asyncio.gather(*(self.router.call_on(split, op(c), [server]) for c in chunks))
        return [sequence for part in parts for sequence in part]

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> TokenAnswer:
        return await sample_tokens(self.generate, lambda: self.servers[0].tokenizer, kwargs)

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        if self.server is None:
            return await self.router.get_logprobs(**kwargs)
        split = "eval" if kwargs.pop("split", "train") != "train" else "train"
        return await self.router.call_on(
            split, lambda s: s.get_logprobs(**kwargs, split=split), [self.server]
        )

    def node_metadata(self) -> dict[str, Any]:
        """The server that sampled the node, and the session's moves so far (if any)."""
        return {} if self.server is None else sampled_on(self.server, self.moves)


def out_of_service(server: APIServer) -> str | None:
    """Why ``server`` cannot take a turn now without a wait (dead engine, open circuit,
    unhealthy), else None."""
    dead = getattr(server, "dead", None)
    if dead is not None:
        return str(dead)
    breaker = getattr(server, "breaker", None)
    if breaker is not None:
        if breaker.state is CircuitState.OPEN and not breaker.allows_request():
            return f"{base_url_of(server)}: circuit open after repeated failures"
        return None
    if not getattr(server, "server_healthy", True):
        return f"{base_url_of(server)}: marked unhealthy"
    return None


def sampled_on(server: Any, moves: list[dict[str, Any]]) -> dict[str, Any]:
    """A node's metadata on where it was sampled: the server, and the session's moves so far
    (only when it moved)."""
    where: dict[str, Any] = {"server": base_url_of(server)}
    return {**where, "server_moves": list(moves)} if moves else where


def base_url_of(server: Any) -> str:
    return str(getattr(getattr(server, "config", None), "base_url", None) or "")
