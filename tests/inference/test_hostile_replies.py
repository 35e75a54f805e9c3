"""The embedded server meets model output built to break its tool-call parser, with the real
model over HTTP: a few earlier assistant turns hold a hostile ``<tool_call>`` block and the model
(greedy) copies it. The answer is 200 with the text as content and no call, streamed or not,
never a 500; a chat that sends back a past call with hostile arguments is served too, and an
ordinary call still comes back as a call."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from atroposlib.inference import InferenceSettings, create_app
from atroposlib.utils.bounded_json import MAX_DEPTH

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs" / "hermes_style"))
from tool_chat import TEMPLATE, TOOLS, few_shot

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]
SURROGATE_CALL = '<tool_call>{"name": "search\\ud800", "arguments": {"q": "x"}}</tool_call>'
"""Plain ASCII text whose JSON decodes to a name no UTF-8 reply can carry."""
DEEP_CALL = '<tool_call>{"name": "search", "arguments": {"q": ' + "[" * 100 + "]" * 100 + "}}"


def copying(reply: str) -> list[dict[str, Any]]:
    """Three earlier turns answered with ``reply`` as text, then a fourth question."""
    messages: list[dict[str, Any]] = []
    for topic in ("cats", "dogs", "fish"):
        messages += [{"role": "user", "content": f"Search for {topic}."},
                     {"role": "assistant", "content": reply}]  # fmt: skip
    return [*messages, {"role": "user", "content": "Search for birds."}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(test_model_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = InferenceSettings(
        model=str(test_model_path), chat_template=TEMPLATE, tool_call_parser="hermes", threads=1
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        # an exception in the app answers 500, as a real server does, instead of raising here
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://127.0.0.1", timeout=600
        ) as client:
            yield client


async def chat(http: httpx.AsyncClient, messages: list[dict[str, Any]], **extra: Any) -> Any:
    name = (await http.get("/v1/models")).json()["data"][0]["id"]
    body = {"model": name, "messages": messages, "tools": TOOLS, "temperature": 0, **extra}
    response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text[:500]
    ChatCompletion.model_validate(response.json())
    [choice] = response.json()["choices"]
    return choice


async def test_a_reply_whose_call_decodes_to_a_lone_surrogate_is_text(
    http: httpx.AsyncClient,
) -> None:
    choice = await chat(http, copying(SURROGATE_CALL), max_tokens=40)
    content = choice["message"]["content"]
    assert content.startswith('<tool_call>{"name": "search\\ud800"'), "the model copied the call"
    assert choice["message"]["tool_calls"] == [] and choice["finish_reason"] != "tool_calls"


async def test_a_streamed_reply_whose_call_decodes_to_a_lone_surrogate_is_text(
    http: httpx.AsyncClient,
) -> None:
    name = (await http.get("/v1/models")).json()["data"][0]["id"]
    body = {"model": name, "messages": copying(SURROGATE_CALL), "tools": TOOLS,
            "temperature": 0, "max_tokens": 40, "stream": True}  # fmt: skip
    content, calls = "", []
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                [choice] = ChatCompletionChunk.model_validate_json(line[6:]).choices
                content += choice.delta.content or ""
                calls += choice.delta.tool_calls or []
    assert content.startswith('<tool_call>{"name": "search\\ud800"') and calls == []


async def test_a_reply_nested_too_deep_is_text(http: httpx.AsyncClient) -> None:
    choice = await chat(http, copying(DEEP_CALL), max_tokens=60)
    content = choice["message"]["content"]
    assert content.startswith("<tool_call>") and content.count("[") > MAX_DEPTH
    assert choice["message"]["tool_calls"] == []


def past_call(arguments: str) -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": arguments}}
    return [{"role": "user", "content": "Search."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]  # fmt: skip


async def test_a_past_call_with_hostile_arguments_is_rendered_as_sent(
    http: httpx.AsyncClient,
) -> None:
    # deeper than json.loads can recurse, yet short enough to fit the model's context
    await chat(http, past_call("[" * 1200 + "]" * 1200), max_tokens=1)
    name = (await http.get("/v1/models")).json()["data"][0]["id"]
    too_long = past_call('{"a":' * 5000 + "1" + "}" * 5000)
    body = {"model": name, "messages": too_long, "tools": TOOLS, "max_tokens": 1}
    response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400 and "shorten the prompt" in response.json()["detail"]


async def test_an_ordinary_call_still_comes_back_as_a_call(http: httpx.AsyncClient) -> None:
    choice = await chat(http, few_shot("birds"), max_tokens=40)
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "search"
    assert json.loads(call["function"]["arguments"]) == {"q": "birds"}
    assert choice["finish_reason"] == "tool_calls"
