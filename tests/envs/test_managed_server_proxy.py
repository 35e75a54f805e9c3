"""The managed-server proxy: an OpenAI agent's session recorded token-exactly, hostile input
answered with 4xx naming the field, and a session's nodes never lost or corrupted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from proxy_testlib import CALCULATOR, Manager, ScriptedEngine, asgi_client, call, proxy_app
from transformers import AutoTokenizer

from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.proxy.client import (
    ProxyRejectedError,
    create_proxy_session,
)

USER = {"role": "user", "content": "What is 6 times 7? Use the calculator."}


@pytest.fixture(scope="module")
def tokenizer(test_model_path: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(test_model_path))


async def open_session(client: httpx.AsyncClient, **body: Any) -> str:
    answer = await client.post("/sessions/create", json=body)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["uuid"])


def assert_one_exact_node(node: dict[str, Any], engine: ScriptedEngine) -> None:
    """Every request continued from exactly the node's ids; exactly the sampled ids trained."""
    tokens, masks, logprobs = node["tokens"], node["masked_tokens"], node["logprobs"]
    assert len(tokens) == len(masks) == len(logprobs)
    trained: set[int] = set()
    for prompt, output in engine.sampled:
        assert tokens[: len(prompt)] == prompt, "a request did not continue the recorded ids"
        assert tokens[len(prompt) : len(prompt) + len(output)] == output
        trained |= set(range(len(prompt), len(prompt) + len(output)))
    assert len(tokens) == len(engine.sampled[-1][0]) + len(engine.sampled[-1][1])
    for position, (token, mask, logprob) in enumerate(zip(tokens, masks, logprobs, strict=True)):
        if position in trained:
            assert mask == token and logprob < 0
        else:
            assert mask == -100 and logprob == 1.0


async def test_an_openai_agent_with_tools_is_recorded_as_one_exact_sequence(
    tokenizer: Any,
) -> None:
    engine = ScriptedEngine(tokenizer, [call("calculate", expression="6*7"), "It is 42.",
                                        "You are welcome."])  # fmt: skip
    async with asgi_client(proxy_app(tokenizer, engine)) as http:
        session = await open_session(http, temperature=1.0)
        agent = openai.AsyncOpenAI(base_url=f"http://proxy/{session}/v1", api_key="x",
                                   http_client=http)  # fmt: skip
        messages: list[Any] = [USER]
        first = await agent.chat.completions.create(model="smol", messages=messages,
                                                    tools=[CALCULATOR])  # fmt: skip
        reply = first.choices[0]
        assert reply.finish_reason == "tool_calls" and reply.message.tool_calls
        tool_call = reply.message.tool_calls[0]
        assert tool_call.function.name == "calculate"
        assert json.loads(tool_call.function.arguments) == {"expression": "6*7"}
        messages += [reply.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": tool_call.id, "content": "42"}]  # fmt: skip
        second = await agent.chat.completions.create(model="smol", messages=messages,
                                                     tools=[CALCULATOR])  # fmt: skip
        assert second.choices[0].message.content == "It is 42."
        messages += [second.choices[0].message.model_dump(exclude_none=True),
                     {"role": "user", "content": "Thanks!"}]  # fmt: skip
        await agent.chat.completions.create(model="smol", messages=messages, tools=[CALCULATOR])
        nodes = (await http.get(f"/{session}/nodes")).json()["nodes"]
    assert len(nodes) == 1
    assert_one_exact_node(nodes[0], engine)
    assert nodes[0]["metadata"] == {
        "finish_reason": "stop",
        "weight_version": 3,
        "server": "http://engine-a/v1",
    }
    first_prompt = tokenizer.decode(engine.requests[0][0])
    assert '"name": "calculate"' in first_prompt  # SmolLM2 cannot render tools: listed
    assert engine.requests[0][1]["temperature"] == 1.0


async def test_tool_calls_the_proxy_never_returned_are_written_out_and_start_a_new_node(
    tokenizer: Any,
) -> None:
    engine = ScriptedEngine(tokenizer, ["Hello!", "Done."])
    async with asgi_client(proxy_app(tokenizer, engine)) as http:
        session = await open_session(http)
        await http.post(f"/{session}/v1/chat/completions", json={"messages": [USER]})
        invented = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_made_up", "type": "function",
             "function": {"name": "calculate", "arguments": "{not json"}}]}  # fmt: skip
        result = {"role": "tool", "tool_call_id": "call_made_up", "content": "error"}
        body = {"messages": [USER, invented, result], "tools": [CALCULATOR]}
        answer = await http.post(f"/{session}/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        nodes = (await http.get(f"/{session}/nodes")).json()["nodes"]
    assert len(nodes) == 2  # the first reply's node is kept as it was
    assert "<tool_call>" in tokenizer.decode(engine.requests[1][0])
    assert nodes[0]["tokens"] == [*engine.sampled[0][0], *engine.sampled[0][1]]


HOSTILE = [
    ({"messages": []}, "messages"),
    ({"messages": "hello"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages.0.content"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 0}, "n"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 10_000}, "n"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "stream": True}, "stream"),
    ({"messages": [{"role": "user", "content": "hi"}], "stop": ["x"] * 100}, "stop"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
     "tools.0.function"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"arguments": "{}"}}]}]},
     "messages.0.tool_calls.0.function.name"),
    ({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "sometimes"},
     "tool_choice"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "field"), HOSTILE)
async def test_bad_requests_get_400_naming_the_field_and_leave_the_nodes(
    tokenizer: Any, body: dict[str, Any], field: str
) -> None:
    engine = ScriptedEngine(tokenizer, ["Hi."])
    async with asgi_client(proxy_app(tokenizer, engine)) as http:
        session = await open_session(http)
        await http.post(f"/{session}/v1/chat/completions", json={"messages": [USER]})
        before = (await http.get(f"/{session}/nodes")).json()
        for path in ("", "/render"):
            answer = await http.post(f"/{session}/v1/chat/completions{path}", json=body)
            assert answer.status_code == 400, answer.text
            error = answer.json()
            assert error["detail"].startswith(field + ":"), error["detail"]
            assert error["error"]["message"] == error["detail"] and error["error"]["code"] == 400
        assert (await http.get(f"/{session}/nodes")).json() == before
    assert len(engine.requests) == 1


async def test_unreadable_bodies_nan_and_huge_bodies(tokenizer: Any) -> None:
    async with asgi_client(proxy_app(tokenizer, ScriptedEngine(tokenizer, []),
                                     max_body_bytes=4096)) as http:  # fmt: skip
        session = await open_session(http)
        url = f"/{session}/v1/chat/completions"
        headers = {"Content-Type": "application/json"}
        answer = await http.post(url, content=b"{not json", headers=headers)
        assert answer.status_code == 400 and answer.json()["detail"].startswith("body")
        nan = b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
        answer = await http.post(url, content=nan, headers=headers)
        assert answer.status_code == 400 and answer.json()["detail"].startswith("temperature")
        huge = {"messages": [{"role": "user", "content": "x" * 10_000}]}
        answer = await http.post(url, json=huge)
        assert answer.status_code == 413 and "body" in answer.json()["detail"]


async def test_unknown_sessions_servers_and_options_are_refused(tokenizer: Any) -> None:
    engine = ScriptedEngine(tokenizer, [])
    text_only = OpenAIServer(APIServerConfig(base_url="http://text-only/v1", health_check=False))
    async with asgi_client(proxy_app(tokenizer, engine, text_only, max_sessions=1)) as http:
        unknown = [("GET", "/nope/nodes"), ("DELETE", "/nope"),
                   ("POST", "/nope/v1/chat/completions"), ("GET", "/%00%ff/nodes")]  # fmt: skip
        for method, path in unknown:
            answer = await http.request(method, path, json={"messages": [USER]})
            assert answer.status_code == 404 and answer.json()["detail"].startswith("session:")
        refusals = [({"tool_parser": "mistral"}, 400, "tool_parser"),
                    ({"track_tree": True}, 400, "track_tree"),
                    ({"base_url": "http://elsewhere/v1"}, 404, "base_url"),
                    ({"base_url": "http://text-only/v1"}, 409, "base_url"),
                    ({"temperature": -2}, 400, "temperature")]  # fmt: skip
        for body, status, field in refusals:
            answer = await http.post("/sessions/create", json=body)
            assert answer.status_code == status and answer.json()["detail"].startswith(field)
        pinned = await http.post("/sessions/create", json={"base_url": "http://engine-a/v1/"})
        assert pinned.json()["base_url"] == "http://engine-a/v1"
        full = await http.post("/sessions/create", json={})
        assert full.status_code == 429 and full.json()["detail"].startswith("sessions:")
        session = pinned.json()["uuid"]
        assert (await http.delete(f"/{session}")).json() == {"status": "deleted", "uuid": session}
        assert (await http.delete(f"/{session}")).status_code == 404
    await text_only.close()


async def test_a_failing_engine_costs_no_recorded_data(tokenizer: Any) -> None:
    engine = ScriptedEngine(tokenizer, ["Let me think.", "It is 42."])
    async with asgi_client(proxy_app(tokenizer, engine, max_attempts=2)) as http:
        session = await open_session(http)
        url = f"/{session}/v1/chat/completions"
        first = (await http.post(url, json={"messages": [USER]})).json()
        before = (await http.get(f"/{session}/nodes")).json()
        follow_up = {"messages": [USER, first["choices"][0]["message"],
                                  {"role": "user", "content": "And?"}]}  # fmt: skip
        engine.failures = 2  # both attempts fail
        answer = await http.post(url, json=follow_up)
        assert answer.status_code == 502 and "unchanged" in answer.json()["detail"]
        assert (await http.get(f"/{session}/nodes")).json() == before
        engine.failures = 1  # one failure: retried
        assert (await http.post(url, json=follow_up)).status_code == 200
        nodes = (await http.get(f"/{session}/nodes")).json()["nodes"]
    assert len(nodes) == 1
    assert_one_exact_node(nodes[0], engine)


class MalformedBackend:
    """Atropos's token call answering a logprob short."""

    server_healthy = True

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> Any:
        return [1, 2], [[5, 6, 7]], [[-0.1, -0.2]], ["stop"]


async def test_a_malformed_engine_answer_is_a_502_not_a_corrupt_node(tokenizer: Any) -> None:
    async with asgi_client(proxy_app(tokenizer, MalformedBackend(), max_attempts=1)) as http:
        session = await open_session(http)
        answer = await http.post(f"/{session}/v1/chat/completions", json={"messages": [USER]})
        assert answer.status_code == 502 and "logprobs" in answer.json()["detail"]
        assert (await http.get(f"/{session}/nodes")).json() == {"nodes": []}


async def test_concurrent_requests_on_one_session_are_recorded_one_after_the_other(
    tokenizer: Any,
) -> None:
    engine = ScriptedEngine(tokenizer, ["One.", "Two."])
    async with asgi_client(proxy_app(tokenizer, engine)) as http:
        session = await open_session(http)
        url = f"/{session}/v1/chat/completions"
        answers = await asyncio.gather(*(http.post(url, json={"messages": [USER]})
                                         for _ in range(2)))  # fmt: skip
        assert [a.status_code for a in answers] == [200, 200]
        nodes = (await http.get(f"/{session}/nodes")).json()["nodes"]
    assert sorted(n["tokens"] for n in nodes) == sorted([*p, *o] for p, o in engine.sampled)


async def test_render_gives_the_ids_the_completion_sends_and_the_session_temperature_wins(
    tokenizer: Any,
) -> None:
    engine = ScriptedEngine(tokenizer, ["Hi.", "Bye."])
    async with asgi_client(proxy_app(tokenizer, engine)) as http:
        session = await open_session(http, temperature=0.7)
        url = f"/{session}/v1/chat/completions"
        first = (await http.post(url, json={"messages": [USER], "temperature": 0})).json()
        body = {"messages": [USER, first["choices"][0]["message"],
                             {"role": "user", "content": "Again"}], "temperature": 0.0}  # fmt: skip
        render = (await http.post(f"{url}/render", json=body)).json()
        await http.post(url, json=body)
        nodes = (await http.get(f"/{session}/nodes")).json()["nodes"]
    assert render["token_ids"] == engine.requests[1][0]
    assert render["num_tokens"] == len(render["token_ids"])
    assert tokenizer.decode(render["token_ids"]) == render["prompt_text"]
    assert [sampling["temperature"] for _, sampling in engine.requests] == [0.7, 0.7]
    assert len(nodes) == 1


async def test_tool_choice_none_returns_the_raw_text(tokenizer: Any) -> None:
    engine = ScriptedEngine(tokenizer, [call("calculate", expression="1+1")])
    async with asgi_client(proxy_app(tokenizer, engine)) as http:
        session = await open_session(http)
        body = {"messages": [USER], "tools": [CALCULATOR], "tool_choice": "none"}
        answer = (await http.post(f"/{session}/v1/chat/completions", json=body)).json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"].get("tool_calls") is None
    assert choice["message"]["content"] == call("calculate", expression="1+1")


async def test_the_proxy_client_drives_a_session_and_collects_its_nodes(tokenizer: Any) -> None:
    engine = ScriptedEngine(tokenizer, [call("calculate", expression="2+2"), "4."])
    app = proxy_app(tokenizer, engine)
    async with asgi_client(app) as http:
        managed = await create_proxy_session("http://proxy", http_client=http)
        async with managed:
            assert managed.get_url() == f"http://proxy/{managed.session_uuid}/v1"
            first = await managed.chat_completion(messages=[USER], tools=[CALCULATOR])
            [tool_call] = first.choices[0].message.tool_calls or []
            history = [USER, first.choices[0].message.model_dump(exclude_none=True),
                       {"role": "tool", "tool_call_id": tool_call.id, "content": "4"}]  # fmt: skip
            await managed.chat_completion(messages=history, tools=[CALCULATOR])
        [node] = managed.get_state()["nodes"]
        assert node.tokens == [*engine.sampled[-1][0], *engine.sampled[-1][1]]
        assert (await http.get(f"/{managed.session_uuid}/nodes")).status_code == 404
        with pytest.raises(ProxyRejectedError, match="tool_parser"):
            await create_proxy_session("http://proxy", tool_parser="nope", http_client=http)


def test_idle_sessions_are_closed_when_a_new_one_opens(tokenizer: Any) -> None:
    from atroposlib.proxy.session import ProxySession, SessionRecorder
    from atroposlib.proxy.session_table import SessionTable

    now = [1000.0]
    table = SessionTable(Manager(), max_sessions=2, idle_timeout_s=60, clock=lambda: now[0])

    def session(name: str) -> ProxySession:
        recorder = SessionRecorder(None, tokenizer, "hermes", 1)
        made = ProxySession(uuid=name, recorder=recorder, model_name="m", tool_parser="hermes",
                            base_url=None, last_accessed=now[0])  # fmt: skip
        return made

    assert table.add(session("a")) and table.add(session("b"))
    assert not table.add(session("c"))
    now[0] += 61
    assert table.add(session("c")) and [s.uuid for s in table.sessions()] == ["c"]


async def test_a_model_tool_call_with_broken_json_comes_back_as_text(tokenizer: Any) -> None:
    broken = '<tool_call>{"name": "calculate", "arguments": {"expression": </tool_call>'
    engine = ScriptedEngine(tokenizer, [broken])
    async with asgi_client(proxy_app(tokenizer, engine)) as http:
        session = await open_session(http)
        body = {"messages": [USER], "tools": [CALCULATOR]}
        answer = await http.post(f"/{session}/v1/chat/completions", json=body)
        nodes = (await http.get(f"/{session}/nodes")).json()["nodes"]
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"].get("tool_calls") is None
    assert choice["message"]["content"] == broken
    assert_one_exact_node(nodes[0], engine)


def test_the_servers_file_names_the_bad_entry(tmp_path: Path) -> None:
    from atroposlib.errors import ConfigError
    from atroposlib.proxy.cli import load_servers_file

    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"model_name": "m", "servers": [
        {"base_url": "http://gpu1:9001/v1", "server_type": "embedded"},
        {"base_url": "http://gpu2:9001/v1", "server_type": "tensorflow"}]}))  # fmt: skip
    with pytest.raises(ConfigError, match=r"servers\.1"):
        load_servers_file(path).server_configs()
    path.write_text('{"model_name": "m", "servers": []}')
    with pytest.raises(ConfigError, match="servers"):
        load_servers_file(path)
    path.write_text(json.dumps({"model_name": "m", "servers": [{"base_url": "http://a/v1"}]}))
    [config] = load_servers_file(path).server_configs()
    assert (config.model_name, config.server_type) == ("m", "vllm")
