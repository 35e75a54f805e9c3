"""The managed-server proxy served on a loopback port inside the running event loop, so an
environment can hand its agents a real OpenAI endpoint over its own inference servers.

    async with serve_proxy(self.server, self.tokenizer) as proxy:
        session = await create_proxy_session(proxy.url)   # session.get_url() for the agent
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from atroposlib.envs.server_handling.managed_server_proxy import ProxySettings, create_app

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 30.0


class LocalProxy:
    """A running proxy: ``url`` while it serves; ``stop()`` ends it."""

    def __init__(self, server: uvicorn.Server, task: asyncio.Task[None], url: str) -> None:
        self._server = server
        self._task = task
        self.url = url

    @classmethod
    async def start(
        cls,
        server_manager: Any,
        tokenizer: Any,
        model_name: str = "policy",
        settings: ProxySettings | None = None,
        host: str = "127.0.0.1",
    ) -> LocalProxy:
        app = create_app(server_manager, tokenizer, model_name, settings)
        config = uvicorn.Config(app, host=host, port=0, log_level="warning", lifespan="off")
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
        return cls(server, task, f"http://{host}:{port}")

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
