"""The proxy as users run it: its CLI in its own process over the embedded server with the real
small model, driven by a plain (synchronous) ``openai`` client, multi-turn with a tool."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from envs_testlib import child_env
from inference_helpers import RunningServer
from proxy_testlib import CALCULATOR

from tests.fakes import free_port

pytestmark = [pytest.mark.slow, pytest.mark.model]


@pytest.fixture
def proxy(smol: RunningServer, tmp_path: Path) -> Iterator[str]:
    servers = {"model_name": smol.name, "tokenizer_name": str(smol.model_path),
               "servers": [{"base_url": f"{smol.url}/v1", "server_type": "embedded"}]}  # fmt: skip
    config = tmp_path / "servers.json"
    config.write_text(json.dumps(servers))
    port = free_port()
    log = (tmp_path / "proxy.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "atroposlib.proxy",
         "--config", str(config), "--port", str(port)],
        env=child_env(), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                assert process.poll() is None and time.monotonic() < deadline, "proxy down"
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=15)
        log.close()


def test_a_plain_openai_client_session_is_one_exact_node(proxy: str, smol: RunningServer) -> None:
    session = httpx.post(f"{proxy}/sessions/create", json={"temperature": 1.0}).json()
    assert session["base_url"] == f"{smol.url}/v1"
    client = openai.OpenAI(base_url=f"{proxy}/{session['uuid']}/v1", api_key="x")
    messages: list = [{"role": "user", "content": "What is 12 * 3? Use the calculator."}]
    sent: list[list[int]] = []
    for turn in range(3):
        render = httpx.post(f"{proxy}/{session['uuid']}/v1/chat/completions/render",
                            json={"messages": messages, "tools": [CALCULATOR]}).json()  # fmt: skip
        sent.append(render["token_ids"])
        reply = (
            client.chat.completions.create(
                model="smol", messages=messages, tools=[CALCULATOR], max_tokens=16, seed=turn
            )
            .choices[0]
            .message
        )
        messages.append(reply.model_dump(exclude_none=True))
        for call in reply.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "36"})
        messages.append({"role": "user", "content": "Go on."})
    [node] = httpx.get(f"{proxy}/{session['uuid']}/nodes").json()["nodes"]
    tokens, masks, logprobs = node["tokens"], node["masked_tokens"], node["logprobs"]
    for before, after in itertools.pairwise(sent):
        assert after[: len(before)] == before  # each turn continued the exact ids
    assert tokens[: len(sent[-1])] == sent[-1]
    trained = [i for i, m in enumerate(masks) if m != -100]
    assert len(trained) >= 3 and all(masks[i] == tokens[i] and logprobs[i] <= 0 for i in trained)
    assert all(logprobs[i] == 1.0 for i in range(len(tokens)) if masks[i] == -100)
    assert node["metadata"]["weight_version"] == 0
    assert httpx.delete(f"{proxy}/{session['uuid']}").json()["status"] == "deleted"
