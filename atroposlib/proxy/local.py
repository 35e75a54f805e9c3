"""A proxy an environment serves itself, on a loopback port inside its running event loop.

With it an environment hands its agents a real OpenAI endpoint over its own inference servers.

    async with serve_proxy(self.server, self.tokenizer) as proxy:
        session = await proxy.open_session()   # session.get_url(), session.api_key: the agent's

The proxy is always keyed, with a fresh random key of its own (also when the run has none,
as on a keyless loopback run): only this environment holds it, never the run's key, and each
agent gets just its session's token, which opens that session and nothing else. Its admin
key (the listing of every session) is another fresh key that nobody is handed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from atroposlib.proxy.app import ProxySettings, create_app
from atroposlib.proxy.client import ProxyManagedServer, create_proxy_session
from atroposlib.security.keys import new_key

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 30.0


class LocalProxy:
    """A running proxy: ``url`` and ``api_key`` while it serves; ``stop()`` ends it."""

    def __init__(
        self, server: uvicorn.Server, task: asyncio.Task[None], url: str, api_key: str
    ) -> None:
        self._server = server
        self._task = task
        self.url = url
        self.api_key = api_key

    @classmethod
    async def start(
        cls,
        server_manager: Any,
        tokenizer: Any,
        model_name: str = "policy",
        settings: ProxySettings | None = None,
        host: str = "127.0.0.1",
    ) -> LocalProxy:
        """Serve a proxy on a free port of ``host``; ``settings`` without ``api_key`` get a
        fresh key (and admin key) of their own."""
        settings = settings or ProxySettings()
        api_key = settings.api_key or new_key()
        if settings.api_key is None:
            admin_key = settings.admin_api_key or new_key()
            settings = settings.model_copy(update={"api_key": api_key, "admin_api_key": admin_key})
        app = create_app(server_manager, tokenizer, model_name, settings)
        config = uvicorn.Config(
            app, host=host, port=0, log_level="warning", lifespan="off", proxy_headers=False
        )
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(), name="managed-server-proxy")
        deadline = asyncio.get_running_loop().time() + STARTUP_TIMEOUT_S
        while not server.started:
            if task.done():
                task.result()  # raises the reason it could not start
                raise RuntimeError("the proxy stopped before it started")
            if asyncio.get_running_loop().time() > deadline:
                task.cancel()
                raise TimeoutError(f"the proxy did not start within {STARTUP_TIMEOUT_S} s")
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        logger.info("managed-server proxy on http://%s:%d", host, port)
        return cls(server, task, f"http://{host}:{port}", api_key)

    async def open_session(self, **options: Any) -> ProxyManagedServer:
        """A new session (``create_proxy_session``'s options) opened with this proxy's key."""
        return await create_proxy_session(self.url, api_key=self.api_key, **options)

    async def stop(self) -> None:
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=10)
        except TimeoutError:
            self._task.cancel()


@asynccontextmanager
async def serve_proxy(
    server_manager: Any, tokenizer: Any, model_name: str = "policy", **settings: Any
) -> AsyncIterator[LocalProxy]:
    """``async with serve_proxy(self.server, self.tokenizer) as proxy:`` a proxy for the block."""
    proxy = await LocalProxy.start(
        server_manager, tokenizer, model_name, ProxySettings(**settings) if settings else None
    )
    try:
        yield proxy
    finally:
        await proxy.stop()
