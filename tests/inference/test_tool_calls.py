"""``tools`` on the embedded server's ``/v1/chat/completions``, as vLLM serves them: rendered
by the chat template (``--chat-template``), reply calls returned as OpenAI ``tool_calls`` with
``--tool-call-parser hermes``. The real model, greedy, on a chat it answers with a call."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from inference_helpers import SERVED_NAME, SERVER_FLAGS, RunningServer, start_server, stop_server
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs" / "hermes_style"))
from tool_chat import TEMPLATE, TOOLS, few_shot

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def parsing(
    test_model_path: Path, subprocess_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    log = tmp_path_factory.mktemp("tools") / "server.log"
    server: RunningServer = start_server(
        test_model_path, subprocess_env, log, "--chat-template", str(TEMPLATE),
        "--tool-call-parser", "hermes", *SERVER_FLAGS,
    )  # fmt: skip
    with httpx.Client(base_url=server.url, timeout=300) as client:
        yield client
    stop_server(server)


def chat(client: httpx.Client, **extra: Any) -> dict[str, Any]:
    body = {"model": SERVED_NAME, "messages": few_shot("birds"), "temperature": 0,
            "max_tokens": 40, **extra}  # fmt: skip
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    ChatCompletion.model_validate(answer)  # the openai client reads it
    return answer


def test_a_reply_s_call_comes_back_as_openai_tool_calls(parsing: httpx.Client) -> None:
    answer = chat(parsing, tools=TOOLS)
    [choice] = answer["choices"]
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "search"
    assert json.loads(call["function"]["arguments"]) == {"q": "birds"}
    assert choice["message"]["content"] is None and choice["finish_reason"] == "tool_calls"


def test_tools_reach_the_template_and_past_calls_render_as_the_model_wrote_them(
    parsing: httpx.Client,
) -> None:
    with_tools = chat(parsing, tools=TOOLS, max_tokens=1)["prompt_token_ids"]
    without = chat(parsing, max_tokens=1)["prompt_token_ids"]
    assert len(with_tools) > len(without)
    root = parsing.get("/v1/models").json()["data"][0]["root"]
    tokenizer = AutoTokenizer.from_pretrained(root)
    text = tokenizer.decode(with_tools)
    assert '"name": "search"' in text and "Search the web" in text
    assert '<tool_call>\n{"name": "search", "arguments": {"q": "fish"}}\n</tool_call>' in text


def test_tool_choice_none_and_no_tools_leave_the_reply_as_text(parsing: httpx.Client) -> None:
    for extra in ({"tools": TOOLS, "tool_choice": "none"}, {}):
        [choice] = chat(parsing, **extra)["choices"]
        assert choice["message"]["tool_calls"] == [] and choice["finish_reason"] != "tool_calls"
        assert "search" in choice["message"]["content"]


def streamed_chat(client: httpx.Client, **extra: Any) -> tuple[str, list[dict[str, Any]], str]:
    """(content, tool_calls, finish_reason) of a streamed chat, joined as the openai client
    joins chunks: calls by their ``index``."""
    body = {"model": SERVED_NAME, "messages": few_shot("birds"), "temperature": 0,
            "max_tokens": 40, "stream": True, **extra}  # fmt: skip
    content, calls, reason = "", {}, ""
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = ChatCompletionChunk.model_validate_json(line.removeprefix("data: "))
            [choice] = chunk.choices
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                assert call.index not in calls, "a call is sent whole, once"
                calls[call.index] = call.model_dump(exclude={"index"}, exclude_none=True)
            reason = choice.finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


def test_a_streamed_reply_carries_the_same_calls_as_the_whole_one(parsing: httpx.Client) -> None:
    [whole] = chat(parsing, tools=TOOLS)["choices"]
    content, calls, reason = streamed_chat(parsing, tools=TOOLS)
    assert reason == "tool_calls" == whole["finish_reason"]
    assert content.strip() == (whole["message"]["content"] or "")
    assert [c["function"] for c in calls] == [c["function"] for c in whole["message"]["tool_calls"]]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)


def test_without_tools_a_streamed_reply_is_its_text(parsing: httpx.Client) -> None:
    for extra in ({"tools": TOOLS, "tool_choice": "none"}, {}):
        [whole] = chat(parsing, **extra)["choices"]
        content, calls, reason = streamed_chat(parsing, **extra)
        assert (content, calls, reason) == (whole["message"]["content"], [], whole["finish_reason"])
        assert "search" in content
