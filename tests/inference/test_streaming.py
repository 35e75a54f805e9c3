"""``stream: true`` through the real ``openai`` client, and clients that hang up mid-request.

Greedy decoding makes a streamed answer comparable with the same request unstreamed: the
pieces must join into exactly its text and token ids.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import httpx
import pytest
from inference_helpers import SERVED_NAME, RunningServer
from openai import OpenAI

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def openai_client(server: RunningServer) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=300, max_retries=0)


def test_streamed_chat_joins_into_the_unstreamed_answer(
    openai_client: OpenAI, client: httpx.Client
) -> None:
    question = [{"role": "user", "content": "Name three colours."}]
    settings: dict[str, Any] = {"temperature": 0, "max_tokens": 24, "n": 2}
    whole = openai_client.chat.completions.create(model=SERVED_NAME, messages=question, **settings)  # type: ignore[call-overload]
    stream = openai_client.chat.completions.create(
        model=SERVED_NAME,
        messages=question,
        stream=True,
        stream_options={"include_usage": True},
        **settings,
    )  # type: ignore[call-overload]
    texts, ids, reasons, roles = ["", ""], [[], []], [None, None], set()
    usage = None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk" and chunk.model == SERVED_NAME
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            assert reasons[choice.index] is None, "a chunk after the choice finished"
            texts[choice.index] += choice.delta.content or ""
            ids[choice.index] += (choice.model_extra or {}).get("token_ids") or []
            reasons[choice.index] = choice.finish_reason
            roles.add(choice.delta.role)
    assert texts == [c.message.content for c in whole.choices]
    assert ids == [c.model_extra["token_ids"] for c in whole.choices]  # type: ignore[index]
    assert reasons == [c.finish_reason for c in whole.choices]
    assert "assistant" in roles
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]
    assert usage.prompt_tokens == whole.usage.prompt_tokens  # type: ignore[union-attr]


def test_streamed_completions_hold_back_stop_strings_and_carry_logprobs(
    openai_client: OpenAI,
) -> None:
    prompts = ["The capital of France is", "One, two, three,"]
    settings: dict[str, Any] = {"temperature": 0, "max_tokens": 12, "stop": [" four", "."]}
    whole = openai_client.completions.create(model=SERVED_NAME, prompt=prompts, **settings)
    stream = openai_client.completions.create(
        model=SERVED_NAME, prompt=prompts, stream=True, logprobs=2, **settings
    )
    texts, tokens, offsets = ["", ""], [[], []], [[], []]
    reasons: list[str | None] = [None, None]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            reasons[choice.index] = choice.finish_reason
            assert choice.logprobs is not None and choice.logprobs.top_logprobs is not None
            assert all(len(top) == 2 for top in choice.logprobs.top_logprobs)
            tokens[choice.index] += choice.logprobs.tokens or []
            offsets[choice.index] += choice.logprobs.text_offset or []
    assert texts == [c.text for c in whole.choices]
    assert reasons == [c.finish_reason for c in whole.choices] == ["stop", "stop"]
    for pieces, starts in zip(tokens, offsets, strict=True):
        assert starts == [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
    assert not texts[1].endswith(" four") and "four" not in texts[1]


def test_stream_is_server_sent_events_ending_with_done(client: httpx.Client) -> None:
    body = {"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 3, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in events[:-1]]
    assert sum(len(chunk["choices"][0]["token_ids"]) for chunk in chunks) == 3
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_bad_streamed_request_is_an_ordinary_4xx(client: httpx.Client) -> None:
    body = {"model": SERVED_NAME, "prompt": "hi", "stream": True, "temperature": -1}
    assert client.post("/v1/completions", json=body).status_code == 422


# -- clients that hang up ---------------------------------------------------------------

STEPS_AFTER_HANGUP = 10
"""Decode steps allowed between reading /health and the server dropping the request: the
hang-up takes effect before the step after the one in flight, plus the time the health
read and the close take (a few steps on a loaded machine). Without cancellation the request
would run all of its 4,000 tokens."""


def wait_until_running(client: httpx.Client) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        health = client.get("/health").json()
        if health["sequences_running"] and health["decode_steps"] >= 3:
            return dict(health)
        time.sleep(0.05)
    raise AssertionError("the request never started")


def wait_until_idle(client: httpx.Client) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        health = client.get("/health").json()
        if health["sequences_running"] == health["sequences_waiting"] == 0:
            return dict(health)
        time.sleep(0.02)
    raise AssertionError(f"the abandoned request is still generating: {health}")


@pytest.mark.parametrize("stream", [False, True])
def test_generation_stops_when_the_client_hangs_up(
    server: RunningServer, client: httpx.Client, stream: bool
) -> None:
    body = {
        "model": SERVED_NAME,
        "prompt": "Once upon a time",
        "max_tokens": 4000,
        "ignore_eos": True,
        "stream": stream,
    }
    payload = json.dumps(body).encode()
    port = int(server.url.rsplit(":", 1)[1])
    hang_up = threading.Event()

    def impatient_client() -> None:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            head = (
                "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
            )
            sock.sendall(head.encode() + payload)
            hang_up.wait(60)  # then the socket closes, mid-generation

    before = client.get("/health").json()
    worker = threading.Thread(target=impatient_client)
    worker.start()
    running = wait_until_running(client)
    hang_up.set()
    worker.join(30)
    idle = wait_until_idle(client)
    assert idle["cancelled_requests"] == before["cancelled_requests"] + 1
    assert idle["decode_steps"] - running["decode_steps"] <= STEPS_AFTER_HANGUP
    # the server is still fine
    again = client.post("/v1/completions", json={**body, "max_tokens": 2, "stream": False})
    assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 2
