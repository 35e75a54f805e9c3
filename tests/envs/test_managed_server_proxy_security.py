"""The proxy as an attacker meets it: no key, a wrong key, an empty key, another key holder
without the session's token, a cross-site page, a rebinding name, someone else's session
listing, the schema routes; each refused with its status and nothing changed (the session and
its nodes). Limits name themselves in their 429."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from proxy_testlib import Manager, ScriptedEngine, asgi_client, proxy_app
from pydantic import ValidationError
from transformers import AutoTokenizer

from atroposlib.proxy.app import ProxySettings, create_app

USER = {"messages": [{"role": "user", "content": "Hi"}]}
KEY, ADMIN = {"authorization": "Bearer run-key"}, {"authorization": "Bearer admin-key"}


@pytest.fixture(scope="module")
def tokenizer(test_model_path: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(test_model_path))


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def one_turn(
    http: httpx.AsyncClient, headers: dict[str, str]
) -> tuple[str, dict[str, str], list[Any]]:
    """A session with one recorded turn: its id, its own headers (its token), its nodes."""
    created = (await http.post("/sessions/create", json={}, headers=headers)).json()
    session, own = created["uuid"], bearer(created["session_token"])
    answer = await http.post(f"/{session}/v1/chat/completions", json=USER, headers=own)
    assert answer.status_code == 200, answer.text
    nodes = (await http.get(f"/{session}/nodes", headers=own)).json()["nodes"]
    assert len(nodes) == 1
    return session, own, nodes


def session_routes(session: str) -> list[tuple[str, str]]:
    return [("GET", f"/{session}/nodes"), ("DELETE", f"/{session}"),
            ("POST", f"/{session}/v1/chat/completions"),
            ("POST", f"/{session}/v1/chat/completions/render"),
            ("GET", f"/{session}/v1/models")]  # fmt: skip


async def test_without_the_key_nothing_is_read_written_or_deleted(tokenizer: Any) -> None:
    engine = ScriptedEngine(tokenizer, ["Hello.", "Again."])
    app = proxy_app(tokenizer, engine, api_key="run-key", admin_api_key="admin-key")
    async with asgi_client(app) as http:
        session, own, nodes = await one_turn(http, KEY)
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Bearer "},
                        {"authorization": "run-key"}):  # fmt: skip
            for method, path in (*session_routes(session), ("POST", "/sessions/create"),
                                 ("GET", "/sessions"), ("GET", "/servers")):  # fmt: skip
                body = USER if method == "POST" else None
                answer = await http.request(method, path, json=body, headers=headers)
                assert answer.status_code == 401, (headers, path)
                assert "Bearer" in answer.json()["detail"]
                assert answer.json()["error"]["type"] == "authentication_error"  # OpenAI's shape
                assert answer.headers["www-authenticate"] == "Bearer"
        assert (await http.get("/health")).status_code == 200
        assert (await http.get(f"/{session}/nodes", headers=own)).json()["nodes"] == nodes
        assert len(engine.sampled) == 1


async def test_another_key_holder_cannot_read_extend_or_close_a_session(tokenizer: Any) -> None:
    engine = ScriptedEngine(tokenizer, ["Hello.", "Mine."])
    app = proxy_app(tokenizer, engine, api_key="run-key", admin_api_key="admin-key")
    async with asgi_client(app) as http:
        session, own, nodes = await one_turn(http, KEY)
        _, other_own, _ = await one_turn(http, KEY)  # a neighbour with a session of its own
        for headers in (KEY, other_own):
            for method, path in session_routes(session):
                body = USER if method == "POST" else None
                answer = await http.request(method, path, json=body, headers=headers)
                expected = 404 if headers == KEY else 401
                assert answer.status_code == expected, (headers, path, answer.text)
        unknown = await http.get("/00000000-0000-4000-8000-000000000000/nodes", headers=KEY)
        assert unknown.status_code == 404  # the same answer as for an id that is not open
        assert unknown.json()["detail"].startswith("session: no open session")
        assert unknown.json()["error"]["type"] == "not_found_error"
        assert (await http.get(f"/{session}/nodes", headers=own)).json()["nodes"] == nodes
        assert (await http.get("/health")).json()["sessions"] == 2
        assert len(engine.sampled) == 2
        listed = (await http.get("/sessions", headers=ADMIN)).text
        assert own["authorization"][7:] not in listed and "token" not in listed


async def test_sessions_are_listed_to_the_admin_key_only(tokenizer: Any) -> None:
    app = proxy_app(tokenizer, ScriptedEngine(tokenizer, ["Hello."]), api_key="run-key",
                    admin_api_key="admin-key")  # fmt: skip
    async with asgi_client(app) as http:
        session, _, _ = await one_turn(http, KEY)
        refused = await http.get("/sessions", headers=KEY)
        assert refused.status_code == 401 and "admin_api_key" in refused.json()["detail"]
        listed = await http.get("/sessions", headers=ADMIN)
        assert [s["uuid"] for s in listed.json()["sessions"]] == [session]
        for method, path in session_routes(session):  # the admin key is no session's token
            body = USER if method == "POST" else None
            answer = await http.request(method, path, json=body, headers=ADMIN)
            assert answer.status_code == 404, (path, answer.text)
        assert (await http.get("/health")).json()["sessions"] == 1


async def test_with_only_an_admin_key_nothing_is_open(tokenizer: Any) -> None:
    engine = ScriptedEngine(tokenizer, ["Hello."])
    async with asgi_client(proxy_app(tokenizer, engine, admin_api_key="admin-key")) as http:
        for method, path in (("POST", "/sessions/create"), ("GET", "/servers"),
                             ("GET", "/sessions"), ("GET", "/v1/models")):  # fmt: skip
            assert (await http.request(method, path, headers=KEY)).status_code == 401, path
        session, own, nodes = await one_turn(http, ADMIN)  # it opens every route, as elsewhere
        assert (await http.get(f"/{session}/nodes")).status_code == 401
        assert (await http.get(f"/{session}/nodes", headers=own)).json()["nodes"] == nodes


async def test_without_a_key_a_browser_page_cannot_reach_a_session(tokenizer: Any) -> None:
    engine = ScriptedEngine(tokenizer, ["Hello."])
    async with asgi_client(proxy_app(tokenizer, engine)) as http:
        session, _, nodes = await one_turn(http, {})
        for headers in ({"sec-fetch-site": "cross-site"}, {"origin": "https://evil.example"},
                        {"host": "rebind.evil.example:9100"}):  # fmt: skip
            for method, path in (("DELETE", f"/{session}"), ("GET", f"/{session}/nodes"),
                                 ("GET", "/sessions"), ("POST", "/sessions/create")):  # fmt: skip
                answer = await http.request(method, path, headers=headers)
                assert answer.status_code == 403, (headers, path)
        assert (await http.get(f"/{session}/nodes")).json()["nodes"] == nodes


async def test_a_session_holds_at_most_max_session_nodes(tokenizer: Any) -> None:
    engine = ScriptedEngine(tokenizer, ["Hello.", "Again."])
    async with asgi_client(proxy_app(tokenizer, engine, max_session_nodes=1)) as http:
        session, _, nodes = await one_turn(http, {})
        full = await http.post(f"/{session}/v1/chat/completions", json=USER)
        assert full.status_code == 429 and "max_session_nodes" in full.json()["detail"]
        assert (await http.get(f"/{session}/nodes")).json()["nodes"] == nodes


async def test_idle_sessions_are_swept_on_a_timer(tokenizer: Any) -> None:
    settings = ProxySettings(idle_timeout_s=0.05, sweep_interval_s=0.05)
    app = create_app(Manager(ScriptedEngine(tokenizer, [])), tokenizer, "smol", settings)
    async with app.router.lifespan_context(app), asgi_client(app) as http:
        await http.post("/sessions/create", json={})
        assert (await http.get("/health")).json()["sessions"] == 1
        for _ in range(100):  # swept within ~0.1 s; up to 5 s on a loaded machine
            await asyncio.sleep(0.05)
            if (await http.get("/health")).json()["sessions"] == 0:
                break
        assert (await http.get("/health")).json()["sessions"] == 0


def test_session_ids_are_random_uuids(tokenizer: Any) -> None:
    from atroposlib.proxy.app import _new_session_id

    ids = {_new_session_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(len(i) == 36 and i[14] == "4" for i in ids)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"api_key": ""}, "api_key is set but empty"),
        ({"admin_api_key": " "}, "admin_api_key is set but empty"),
        ({"host": "0.0.0.0"}, "--insecure-no-key"),
    ],
)
def test_an_empty_key_or_an_open_bind_is_refused_at_start(
    fields: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValidationError, match=named):
        ProxySettings(**fields)
    assert ProxySettings(host="0.0.0.0", insecure_no_key=True).api_key is None


def client_at(app: Any, address: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(address, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://proxy")


async def test_one_client_cannot_take_every_session(tokenizer: Any) -> None:
    app = proxy_app(tokenizer, ScriptedEngine(tokenizer, []), max_sessions=3,
                    max_sessions_per_client=2)  # fmt: skip
    async with client_at(app, "10.0.0.1") as greedy, client_at(app, "10.0.0.2") as other:
        for _ in range(2):
            assert (await greedy.post("/sessions/create", json={})).status_code == 200
        refused = await greedy.post("/sessions/create", json={})
        assert refused.status_code == 429
        assert "max_sessions_per_client" in refused.json()["detail"]
        assert (await other.post("/sessions/create", json={})).status_code == 200
        full = await other.post("/sessions/create", json={})
        assert full.status_code == 429 and "(max_sessions)" in full.json()["detail"]
        assert (await greedy.get("/health")).json()["sessions"] == 3


async def test_a_session_holds_at_most_max_session_bytes(tokenizer: Any) -> None:
    engine = ScriptedEngine(tokenizer, ["Hello.", "Again."])
    long = {"messages": [{"role": "user", "content": "Tell me more. " * 40}]}
    async with asgi_client(proxy_app(tokenizer, engine, max_session_bytes=1024)) as http:
        session = (await http.post("/sessions/create", json={})).json()["uuid"]
        first = await http.post(f"/{session}/v1/chat/completions", json=long)
        assert first.status_code == 200, first.text  # under the cap when it was sent
        nodes = (await http.get(f"/{session}/nodes")).json()["nodes"]
        full = await http.post(f"/{session}/v1/chat/completions", json=USER)
        assert full.status_code == 429 and "max_session_bytes" in full.json()["detail"]
        assert (await http.get(f"/{session}/nodes")).json()["nodes"] == nodes
        assert len(engine.sampled) == 1


SCHEMA_ROUTES = ("/openapi.json", "/docs", "/redoc")
OFF = {404, 405}  # no such route (405: the path also fits DELETE /{session_id})


@pytest.mark.parametrize(
    ("settings", "without_key", "with_key"),
    [
        ({}, OFF, OFF),
        ({"api_key": "run-key"}, {401}, OFF),
        ({"expose_api_docs": True}, {200}, {200}),
        ({"expose_api_docs": True, "api_key": "run-key"}, {401}, {200}),
    ],
)
async def test_the_schema_routes_are_off_unless_exposed_then_behind_the_key(
    tokenizer: Any, settings: dict[str, Any], without_key: set[int], with_key: set[int]
) -> None:
    app = proxy_app(tokenizer, ScriptedEngine(tokenizer, []), **settings)
    async with asgi_client(app) as http:
        for path in SCHEMA_ROUTES:
            assert (await http.get(path)).status_code in without_key, path
            assert (await http.get(path, headers=KEY)).status_code in with_key, path
        assert (await http.get("/health")).json()["sessions"] == 0
