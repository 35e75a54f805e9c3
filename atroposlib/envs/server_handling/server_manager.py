"""``ServerManager``: least-loaded routing, retries and failover over any number of servers."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from functools import cached_property
from typing import Any, TypeVar, cast

from openai.types import Completion
from openai.types.chat import ChatCompletion
from pydantic import BaseModel, Field

from atroposlib.envs.server_handling.adaptive_semaphore import AsyncSemWithAdaptiveWeight
from atroposlib.envs.server_handling.choices import (
    all_choices,
    generate_all,
    merge_choices,
)
from atroposlib.envs.server_handling.circuit import CircuitState
from atroposlib.envs.server_handling.dedicated import DedicatedServer
from atroposlib.envs.server_handling.managed_server import (
    DummyManagedServer,
    ManagedServer,
    dummy_or_refuse,
)
from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.reasoning import ReasoningConfig
from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    GeneratedSequence,
    ServerBaseline,
    TokenAnswer,
    sample_tokens,
)
from atroposlib.envs.server_handling.server_harness import ServerHarness
from atroposlib.envs.server_handling.session_server import SessionServer
from atroposlib.envs.server_handling.sglang_server import EmbeddedServer, SGLangServer
from atroposlib.envs.server_handling.slurm import resolve_server_configs
from atroposlib.envs.server_handling.vllm_server import VLLMServer
from atroposlib.errors import (
    ConfigError,
    InferenceEngineDeadError,
    InferenceError,
    InferenceRejectedError,
    InferenceUnavailableError,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

BACKENDS: dict[str, type[APIServer]] = {
    "openai": OpenAIServer,
    "vllm": VLLMServer,
    "sglang": SGLangServer,
    "embedded": EmbeddedServer,
}
OPTIONAL_BACKENDS = {"trl": "atroposlib.envs.server_handling.trl_vllm_server:TrlVllmServer"}
"""Backends whose dependencies are optional: imported when a config names them."""

__all__ = [
    "APIServer",
    "APIServerConfig",
    "DummyManagedServer",
    "ManagedServer",
    "ReasoningConfig",
    "ServerBaseline",
    "ServerManager",
    "ServerManagerConfig",
]


class ServerManagerConfig(BaseModel):
    slurm: bool = Field(default=False, description="Discover inference servers from SLURM.")
    testing: bool = Field(default=False, description="Use canned local answers, no server.")
    max_n_completions: int = Field(
        default=8, ge=1, description="Split larger n into requests of at most this many."
    )


def backend_for(config: APIServerConfig) -> type[APIServer]:
    if config.server_type in OPTIONAL_BACKENDS:
        module, _, name = OPTIONAL_BACKENDS[config.server_type].partition(":")
        try:
            backend: type[APIServer] = getattr(importlib.import_module(module), name)
        except ImportError as exc:
            raise ConfigError(
                f"server_type {config.server_type!r} needs {exc.name}: "
                'pip install "atroposlib[atropos-compat]"'
            ) from exc
        return backend
    if config.server_type not in BACKENDS:
        choices = sorted([*BACKENDS, *OPTIONAL_BACKENDS])
        raise ConfigError(
            f"server_type {config.server_type!r} is not supported; use one of {choices}"
        )
    return BACKENDS[config.server_type]


class ServerManager:
    """Routes each request to the healthy server with the most free slots; retries elsewhere."""

    # The ServerBaseline defaults, for a manager whose servers were set by hand.
    max_retries: int = ServerBaseline.model_fields["max_retries"].default
    retry_backoff_s: float = ServerBaseline.model_fields["retry_backoff_s"].default

    def __init__(
        self,
        configs: ServerBaseline | Sequence[APIServerConfig],
        server_class: type[APIServer] | None = None,
        slurm: bool = False,
        testing: bool = False,
        max_n_completions: int = 8,
        reasoning_config: ReasoningConfig | None = None,
        tool_parser: str | None = None,
    ) -> None:
        self.max_n_completions = max_n_completions
        self.reasoning_config = reasoning_config
        self.tool_parser = tool_parser
        """Tool-call parser for ``managed_server()`` chats with ``tools`` (``"hermes"``)."""
        if testing:
            # duck-typed like an APIServer, as Atropos's harness is
            self.servers: list[APIServer] = [cast(APIServer, ServerHarness())]
        else:
            resolved = resolve_server_configs(configs, slurm=slurm)
            if server_class is APIServer or (
                server_class is not None and inspect.isabstract(server_class)
            ):
                server_class = None  # Atropos envs name the base APIServer: pick by type
            self.servers = [
                (server_class or backend_for(c))(c, reasoning_config=reasoning_config)
                for c in resolved
            ]
        first = self.servers[0].config
        self.max_retries = first.max_retries
        self.retry_backoff_s = first.retry_backoff_s

    @cached_property
    def _slot_freed(self) -> asyncio.Event:
        return asyncio.Event()

    @cached_property
    def _probes(self) -> set[asyncio.Task[None]]:
        return set()

    # ---- routing ------------------------------------------------------------------------

    def _usable(self, server: APIServer, split: str) -> bool:
        if engine_dead(server) is not None:
            return False
        breaker = getattr(server, "breaker", None)
        if breaker is None:  # a server of Atropos's shape: its own health flag and semaphores
            return bool(server.server_healthy) and free_slots(server, split) > 0
        if breaker.state is CircuitState.CLOSED:
            return free_slots(server, split) > 0
        if not breaker.allows_request():
            return False
        if server.config.health_check:
            breaker.on_request_start()
            probe = asyncio.create_task(self._probe(server))
            self._probes.add(probe)
            probe.add_done_callback(self._probes.discard)
            return False
        return free_slots(server, split) > 0

    async def _probe(self, server: APIServer) -> None:
        if await server.health_check():
            server.breaker.record_success()
        else:
            server.breaker.trip()
        self._slot_freed.set()

    @property
    def dead_reason(self) -> str | None:
        """Why no server can sample any more (every engine is dead), else None."""
        if self.servers and all(engine_dead(s) is not None for s in self.servers):
            return "; ".join(str(engine_dead(s)) for s in self.servers)
        return None

    async def _acquire(
        self,
        split: str,
        servers: Sequence[APIServer],
        tie_break: Callable[[APIServer], int] | None = None,
    ) -> APIServer:
        """The usable server with most free slots (the lowest ``tie_break`` among equals, then
        a random one); waits while none is usable."""
        while True:
            if all(engine_dead(s) is not None for s in servers):
                raise InferenceEngineDeadError("; ".join(str(engine_dead(s)) for s in servers))
            usable = [s for s in servers if self._usable(s, split)]
            if usable:
                most_free = max(free_slots(s, split) for s in usable)
                best = [s for s in usable if free_slots(s, split) == most_free]
                if tie_break is not None:
                    least = min(tie_break(s) for s in best)
                    best = [s for s in best if tie_break(s) == least]
                return random.choice(best)
            waits = [s.breaker.seconds_until_retry() for s in servers if hasattr(s, "breaker")]
            timeout = max(0.01, min([w for w in waits if w > 0] or [0.5]))
            self._slot_freed.clear()
            with suppress(TimeoutError):
                await asyncio.wait_for(self._slot_freed.wait(), timeout=timeout)

    @cached_property
    def sessions_on(self) -> dict[int, int]:
        """Open ``managed_server()`` sessions pinned to each server, by ``id(server)``."""
        return {}

    async def least_loaded(self, split: str, servers: Sequence[APIServer]) -> APIServer:
        """The usable one of ``servers`` with the most free slots, the one holding fewest open
        sessions among equals (waits while none is usable)."""
        return await self._acquire(split, servers, lambda s: self.sessions_on.get(id(s), 0))

    async def call_on(
        self, split: str, op: Callable[[APIServer], Awaitable[T]], servers: Sequence[APIServer]
    ) -> T:
        """``op`` on one of ``servers`` with the manager's retries and circuit breakers."""
        return await self._call(split, op, servers)

    async def _call(
        self,
        split: str,
        op: Callable[[APIServer], Awaitable[T]],
        servers: Sequence[APIServer] | None = None,
    ) -> T:
        pool = servers if servers is not None else self.servers
        attempt = 0
        while True:
            server = await self._acquire(split, pool)
            try:
                return await op(server)
            except InferenceRejectedError:
                raise
            except InferenceEngineDeadError:
                continue  # another server, if one is alive (_acquire raises when none is)
            except InferenceError as exc:
                attempt += 1
                if attempt > self.max_retries:
                    raise InferenceUnavailableError(
                        f"inference failed after {attempt} attempts; last: {exc}"
                    ) from exc
                delay = min(10.0, self.retry_backoff_s * 2 ** (attempt - 1))
                logger.warning("inference attempt %d failed (%s); retrying", attempt, exc)
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            finally:
                self._slot_freed.set()

    # ---- OpenAI-style calls -------------------------------------------------------------

    def split_chunks(self, n: int) -> list[int]:
        """``n`` as requests of at most ``max_n_completions`` choices each."""
        sizes = [self.max_n_completions] * (n // self.max_n_completions)
        return sizes + ([n % self.max_n_completions] if n % self.max_n_completions else [])

    async def _fan_out(self, kind: str, kwargs: dict[str, Any]) -> Any:
        split = "eval" if kwargs.get("split", "train") != "train" else "train"
        n = int(kwargs.get("n") or 1)

        async def one(server: APIServer, chunk: int) -> Any:
            method = server.chat_completion if kind == "chat" else server.completion
            if not server.config.n_kwarg_is_ignored or chunk == 1:

                async def ask(count: int) -> Any:
                    return await method(**{**kwargs, "n": count, "split": split})

                parts = await all_choices(ask, chunk, server, lambda r: len(r.choices))
                return merge_choices(parts)
            parts = await asyncio.gather(
                *(method(**{**kwargs, "n": 1, "split": split}) for _ in range(chunk))
            )
            return merge_choices(list(parts))

        def op(chunk: int) -> Callable[[APIServer], Awaitable[Any]]:
            return lambda server: one(server, chunk)

        results = await asyncio.gather(*(self._call(split, op(c)) for c in self.split_chunks(n)))
        return merge_choices(list(results))

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        """``/chat/completions`` with OpenAI kwargs; ``split="eval"`` uses eval capacity."""
        return await self._fan_out("chat", kwargs)

    async def completion(self, **kwargs: Any) -> Completion:
        """``/completions`` with OpenAI kwargs; ``split="eval"`` uses eval capacity."""
        return await self._fan_out("completion", kwargs)

    @property
    def returns_token_ids(self) -> bool:
        """Whether some server samples token-in/token-out (vllm, sglang, embedded)."""
        return any(server.supports_token_ids for server in self.servers)

    async def generate(
        self, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]:
        """Token-in/token-out sampling on a server that returns token ids and logprobs."""
        pool = self._token_servers()
        split = "eval" if sampling.get("split", "train") != "train" else "train"

        def op(chunk: int) -> Callable[[APIServer], Awaitable[list[GeneratedSequence]]]:
            return lambda server: generate_all(server, input_ids, chunk, sampling)

        chunks = self.split_chunks(n)
        results = await asyncio.gather(*(self._call(split, op(c), pool) for c in chunks))
        return [sequence for chunk in results for sequence in chunk]

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> TokenAnswer:
        """Atropos 0.4's token call on servers that return token ids, ``n`` split like
        ``generate`` (see APIServer)."""
        return await sample_tokens(
            self.generate, lambda: self._token_servers()[0].tokenizer, kwargs
        )

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        """Prompt logprobs (top-k) of ``input_ids`` or ``prompt``; see APIServer.get_logprobs."""
        split = "eval" if kwargs.pop("split", "train") != "train" else "train"
        return await self._call(split, lambda server: server.get_logprobs(**kwargs, split=split))

    @asynccontextmanager
    async def dedicated_server(self) -> AsyncIterator[DedicatedServer]:
        """Pin the least-loaded healthy server for the length of the block (one slot held)."""
        server = await self._acquire("train", self.servers)
        async with server.sem:
            try:
                yield DedicatedServer(self, server)
            finally:
                self._slot_freed.set()

    @asynccontextmanager
    async def managed_server(
        self,
        tokenizer: Any = None,
        base_url: str | None = None,
        preserve_think_blocks: bool = False,
    ) -> AsyncIterator[Any]:
        """Tracks token ids, prompt masks and logprobs of every completion made inside.

        Every turn goes to the server of the block's first turn (one of those at ``base_url``
        if given), so it continues the prefix that server has cached; the block moves to
        another only when that one fails, and the nodes sampled after a move say so
        (``metadata["server_moves"]``, see :mod:`.session_server`).

        Servers without token ids (``server_type: openai``) give placeholder nodes when
        ``ATROPOS_ALLOW_DUMMY_MANAGED_SERVER=1`` (evaluation only), as in Atropos 0.4.
        """
        pool = [s for s in self.servers if not base_url or s.config.base_url == base_url]
        if not pool:
            raise ConfigError(f"managed_server(base_url={base_url!r}): no such server")
        if not any(s.supports_token_ids for s in pool):
            managed: Any = dummy_or_refuse(self, pool[0])
        else:
            managed = ManagedServer(
                SessionServer(self, [s for s in pool if s.supports_token_ids]),
                tokenizer=tokenizer or self._default_tokenizer(),
                tool_parser=self.tool_parser,
                preserve_think_blocks=preserve_think_blocks,
            )
        try:
            yield managed
        finally:
            managed.reset()
            if isinstance(managed.server, SessionServer):
                managed.server.close()

    def _token_servers(self) -> list[APIServer]:
        pool = [s for s in self.servers if s.supports_token_ids]
        if not pool:
            raise ConfigError(
                "managed_server() needs token ids: set server_type to vllm, sglang or embedded "
                f"(configured: {sorted({s.config.server_type for s in self.servers})})"
            )
        return pool

    def _default_tokenizer(self) -> Any:
        config = self.servers[0].config
        if config.tokenizer_name in (None, "", "none") and config.model_name == "default":
            raise ConfigError("managed_server() needs a tokenizer: pass tokenizer=self.tokenizer")
        return self.servers[0].tokenizer

    # ---- bookkeeping --------------------------------------------------------------------

    async def update_weight(self, weight: float) -> None:
        for server in self.servers:
            await server.update_weight(weight)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for index, server in enumerate(self.servers):
            out.update(server.metrics(f"server_{index}"))
        return out

    async def close(self) -> None:
        for probe in list(self._probes):
            probe.cancel()
        for server in self.servers:
            await server.close()


def engine_dead(server: APIServer) -> str | None:
    """Why the server's engine counts as dead; None for a live one or a server of Atropos's
    shape (set by hand, no ``dead`` attribute)."""
    return getattr(server, "dead", None)


def free_slots(server: APIServer, split: str) -> int:
    """Request slots a server can take now: its semaphore for the split (``sem`` for
    training, ``eval_sem`` for evaluation), whatever class the server is."""
    semaphore: AsyncSemWithAdaptiveWeight = server.eval_sem if split == "eval" else server.sem
    return semaphore.free


def __getattr__(name: str) -> Any:
    """Atropos's ``server_manager.TrlVllmServer``, imported on first use (optional
    dependencies: transformers, aiohttp)."""
    if name == "TrlVllmServer":
        from atroposlib.envs.server_handling.trl_vllm_server import TrlVllmServer

        return TrlVllmServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
