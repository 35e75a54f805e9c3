"""Atropos reports about how an env talks to inference servers and reads HTTP answers
(register: docs/atropos-reports.md). Each test runs a real uvicorn server on a free port."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.errors import InferenceUnavailableError
from atroposlib.utils.io import parse_http_response
from tests.fakes import uvicorn_on_loopback


class CountingServer:
    """``/v1/chat/completions`` that answers one choice whatever ``n`` says (as some hosted
    APIs do), or 500 while ``failing``; every request is counted."""

    def __init__(self) -> None:
        self.requests = 0
        self.failing = False
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.chat)

    async def chat(self, body: dict[str, Any]) -> Any:
        self.requests += 1
        if self.failing:
            return JSONResponse({"error": "overloaded"}, status_code=500)
        message = {"role": "assistant", "content": f"reply {self.requests}"}
        return {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}  # fmt: skip


@pytest.fixture
def counting() -> Iterator[tuple[CountingServer, str]]:
    server = CountingServer()
    with uvicorn_on_loopback(server.app) as url:
        yield server, f"{url}/v1"


def manager(url: str, **settings: Any) -> ServerManager:
    config = APIServerConfig(base_url=url, model_name="m", retry_backoff_s=0.0,
                             circuit_failure_threshold=100, **settings)  # fmt: skip
    return ServerManager([config])


CHAT = [{"role": "user", "content": "hi"}]


async def test_486_one_completion_from_a_server_that_ignores_n_is_one_request(
    counting: tuple[CountingServer, str],
) -> None:
    server, url = counting
    servers = manager(url, n_kwarg_is_ignored=True)
    answer = await servers.chat_completion(messages=CHAT, n=1)
    assert server.requests == 1 and len(answer.choices) == 1
    answer = await servers.chat_completion(messages=CHAT, n=3)
    assert server.requests == 4 and len(answer.choices) == 3


@pytest.mark.parametrize("max_retries", [0, 2, 3])
async def test_487_a_failing_request_is_tried_max_retries_plus_one_times(
    counting: tuple[CountingServer, str], max_retries: int
) -> None:
    server, url = counting
    server.failing = True
    with pytest.raises(InferenceUnavailableError):
        await manager(url, max_retries=max_retries).chat_completion(messages=CHAT)
    assert server.requests == max_retries + 1


def error_app() -> FastAPI:
    app = FastAPI()

    @app.get("/busy")
    async def busy() -> PlainTextResponse:
        return PlainTextResponse("queue full, retry later", status_code=503)

    @app.get("/broken")
    async def broken() -> StreamingResponse:
        async def chunks() -> Any:
            for _ in range(64):
                yield b"x" * 65536
                await asyncio.sleep(0)

        return StreamingResponse(chunks(), status_code=500)

    return app


@pytest.mark.parametrize(("path", "status"), [("busy", 503), ("broken", 500)])
async def test_484_the_http_error_reaches_the_caller_when_its_body_is_gone(
    path: str, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A response opened without ``async with``: aiohttp's raise_for_status releases its
    connection, so the body cannot be read after it; the status must still come out."""
    with uvicorn_on_loopback(error_app()) as url:
        async with aiohttp.ClientSession() as session:
            response = await session.get(f"{url}/{path}")
            with caplog.at_level(logging.ERROR), pytest.raises(aiohttp.ClientResponseError) as err:
                await parse_http_response(response)
            assert err.value.status == status
            assert f"status {status}" in caplog.text and "body unreadable" in caplog.text

            async with session.get(f"{url}/busy") as response:  # body still there: logged
                with pytest.raises(aiohttp.ClientResponseError):
                    await parse_http_response(response)
            assert "queue full, retry later" in caplog.text
