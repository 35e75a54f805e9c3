"""A scripted token engine and a proxy app over it, for the managed-server proxy's tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import FastAPI

from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    GeneratedSequence,
)
from atroposlib.errors import InferenceError
from atroposlib.proxy.app import ProxySettings, create_app

Reply = str | Callable[[list[int]], str]


class ScriptedEngine(APIServer):
    """Samples the scripted replies in order (the real tokenizer's ids, then the end-of-turn
    token); records every request's ids and sampling; ``failures`` requests fail first."""

    supports_token_ids = True

    def __init__(self, tokenizer: Any, replies: list[Reply], url: str = "http://engine-a/v1"):
        config = APIServerConfig(base_url=url, server_type="embedded", health_check=False)
        super().__init__(config)
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.requests: list[tuple[list[int], dict[str, Any]]] = []
        self.sampled: list[tuple[list[int], list[int]]] = []
        self.failures = 0

    async def generate(
        self, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]:
        self.requests.append((list(input_ids), dict(sampling)))
        if self.failures:
            self.failures -= 1
            raise InferenceError("engine-a: HTTP 503")
        out = []
        for index in range(n):
            reply = self.replies.pop(0)
            text = reply(input_ids) if callable(reply) else reply
            ids = [*self.tokenizer.encode(text, add_special_tokens=False), 2]
            logprobs = [-0.25 - 0.01 * (i + index) for i in range(len(ids))]
            self.sampled.append((list(input_ids), ids))
            out.append(GeneratedSequence(ids, logprobs, "stop", text, weight_version=3))
        return out

    async def chat_completion(self, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def completion(self, **kwargs: Any) -> Any:
        raise NotImplementedError


class Manager:
    """What the proxy needs of a ServerManager: its servers."""

    def __init__(self, *servers: Any) -> None:
        self.servers = list(servers)


def proxy_app(tokenizer: Any, *servers: Any, **settings: Any) -> FastAPI:
    return create_app(Manager(*servers), tokenizer, "smol", ProxySettings(**settings))


def asgi_client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy")


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
