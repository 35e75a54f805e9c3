"""The proxy on a real uvicorn (a free loopback port) as an attacker meets it: no key, a wrong or
an empty key, another session's id, the key without the session's token, a cross-site page, a
rebinding name, one client taking every session (forged X-Forwarded-For included), a session
past its byte cap, an unauthenticated body that never ends. Each refused with its status (each
limit named in its 429) and the sessions' contents unchanged; the owner's own session keeps
working throughout."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from proxy_testlib import Manager, ScriptedEngine, proxy_app
from transformers import AutoTokenizer

from atroposlib.proxy.local import serve_proxy
from tests.fakes import uvicorn_on_loopback
from tests.raw_http import unfinished_post

KEY = {"authorization": "Bearer run-key"}
ADMIN = {"authorization": "Bearer admin-key"}
USER = {"messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture(scope="module")
def tokenizer(test_model_path: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(test_model_path))


@pytest.fixture
def keyed(tokenizer: Any) -> Iterator[httpx.Client]:
    engine = ScriptedEngine(tokenizer, ["Hello.", "Again.", "Third."])
    app = proxy_app(tokenizer, engine, api_key="run-key", admin_api_key="admin-key",
                    max_sessions=4, max_sessions_per_client=2, max_session_bytes=4096)  # fmt: skip
    with uvicorn_on_loopback(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        yield http


def create(http: httpx.Client) -> tuple[str, dict[str, str]]:
    """A new session's id and its own headers (its token)."""
    created = http.post("/sessions/create", json={}, headers=KEY)
    assert created.status_code == 200, created.text
    return created.json()["uuid"], {"authorization": f"Bearer {created.json()['session_token']}"}


def contents(http: httpx.Client, session: str, own: dict[str, str]) -> list[Any]:
    answer = http.get(f"/{session}/nodes", headers=own)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["nodes"])


def test_without_the_key_or_with_another_id_nothing_changes(keyed: httpx.Client) -> None:
    mine, own = create(keyed)
    assert keyed.post(f"/{mine}/v1/chat/completions", json=USER, headers=own).status_code == 200
    before = contents(keyed, mine, own)
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Bearer"},
                    {"authorization": ""}, {"authorization": "run-key"}):  # fmt: skip
        for method, path in (("GET", f"/{mine}/nodes"), ("DELETE", f"/{mine}"),
                             ("POST", f"/{mine}/v1/chat/completions"), ("GET", "/sessions"),
                             ("POST", "/sessions/create")):  # fmt: skip
            body = USER if method == "POST" else None
            answer = keyed.request(method, path, json=body, headers=headers)
            assert answer.status_code == 401, (headers, path, answer.text)
    listing = keyed.get("/sessions", headers=KEY)
    assert listing.status_code == 401  # the run key never lists the ids
    other = str(uuid.UUID(int=uuid.UUID(mine).int ^ 1))  # a neighbour of a real id
    for session, headers in ((other, KEY), (other, own), (mine, KEY)):  # the key is no token
        for method, path in (("GET", f"/{session}/nodes"), ("DELETE", f"/{session}"),
                             ("POST", f"/{session}/v1/chat/completions")):  # fmt: skip
            body = USER if method == "POST" else None
            answer = keyed.request(method, path, json=body, headers=headers)
            assert answer.status_code == (401 if headers == own else 404), (path, answer.text)
    assert contents(keyed, mine, own) == before
    assert keyed.get("/health").json()["sessions"] == 1


def test_limits_name_themselves_and_leave_the_session_alone(keyed: httpx.Client) -> None:
    first, own = create(keyed)
    assert keyed.post("/sessions/create", json={}, headers=KEY).status_code == 200
    for forwarded in (None, "10.9.8.7", "10.9.8.6, 127.0.0.1"):  # a header names no client
        headers = KEY if forwarded is None else KEY | {"x-forwarded-for": forwarded}
        third = keyed.post("/sessions/create", json={}, headers=headers)
        assert third.status_code == 429 and "max_sessions_per_client" in third.json()["detail"]
    assert keyed.get("/health").json()["sessions"] == 2
    long = {"messages": [{"role": "user", "content": "Say more. " * 200}]}
    assert keyed.post(f"/{first}/v1/chat/completions", json=long, headers=own).status_code == 200
    before = contents(keyed, first, own)
    full = keyed.post(f"/{first}/v1/chat/completions", json=USER, headers=own)
    assert full.status_code == 429 and "max_session_bytes" in full.json()["detail"]
    assert contents(keyed, first, own) == before


@pytest.mark.parametrize("declared", [15 * 2**20, None], ids=["15-MiB-announced", "chunked"])
def test_a_body_without_the_key_is_refused_before_it_is_read(
    keyed: httpx.Client, declared: int | None
) -> None:
    mine, own = create(keyed)
    assert keyed.post(f"/{mine}/v1/chat/completions", json=USER, headers=own).status_code == 200
    before = contents(keyed, mine, own)
    url = str(keyed.base_url)
    for headers in ({}, {"authorization": "Bearer wrong"}):
        for path in (f"/{mine}/v1/chat/completions", "/sessions/create"):
            answer = unfinished_post(url, path, headers, declared=declared)
            assert answer.status == 401, (path, answer.body)
            assert answer.headers["www-authenticate"] == "Bearer"
    answer = unfinished_post(url, f"/{mine}/v1/chat/completions", KEY, declared=declared)
    assert answer.status == 404  # the proxy's key, not the session's token: refused first too
    assert contents(keyed, mine, own) == before
    assert keyed.get("/health").json()["sessions"] == 1


def test_without_a_key_a_browser_page_changes_nothing(tokenizer: Any) -> None:
    app = proxy_app(tokenizer, ScriptedEngine(tokenizer, ["Hello."]))
    with uvicorn_on_loopback(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        session = http.post("/sessions/create", json={}).json()["uuid"]
        assert http.post(f"/{session}/v1/chat/completions", json=USER).status_code == 200
        before = http.get(f"/{session}/nodes").json()
        for headers in ({"sec-fetch-site": "cross-site"}, {"origin": "https://evil.example"},
                        {"host": "rebind.evil.example"}):  # fmt: skip
            for method, path in (("DELETE", f"/{session}"), ("GET", f"/{session}/nodes"),
                                 ("POST", f"/{session}/v1/chat/completions"),
                                 ("GET", "/sessions"), ("POST", "/sessions/create")):  # fmt: skip
                body = USER if method == "POST" else None
                answer = http.request(method, path, json=body, headers=headers)
                assert answer.status_code == 403, (headers, path, answer.text)
        assert http.get(f"/{session}/nodes").json() == before
        assert http.get("/health").json()["sessions"] == 1


async def test_the_proxy_an_env_starts_is_keyed_and_counts_peers_not_headers(
    tokenizer: Any,
) -> None:
    engine = ScriptedEngine(tokenizer, ["Hello."])
    manager = Manager(engine)
    async with serve_proxy(manager, tokenizer, max_sessions_per_client=2) as proxy, \
            httpx.AsyncClient(base_url=proxy.url, timeout=30) as http:  # fmt: skip
        assert len(proxy.api_key) >= 40  # a fresh key of its own, though the run has none
        assert (await http.post("/sessions/create", json={})).status_code == 401
        session = await proxy.open_session()
        async with session:
            reply = await session.chat_completion(**USER)
            assert reply.choices[0].message.content == "Hello."
            nodes = (await session.fetch_state())["nodes"]
            peer = {"authorization": f"Bearer {proxy.api_key}"}
            forged = peer | {"x-forwarded-for": "10.1.2.3"}
            assert (await http.post("/sessions/create", json={}, headers=forged)).status_code == 200
            third = await http.post("/sessions/create", json={}, headers=forged | {
                "x-forwarded-for": "10.1.2.4", "forwarded": "for=10.1.2.5"})  # fmt: skip
            assert third.status_code == 429, third.text
            assert "max_sessions_per_client" in third.json()["detail"]
            for headers in ({}, peer):
                answer = await http.get(f"/{session.session_uuid}/nodes", headers=headers)
                assert answer.status_code in (401, 404)
            assert (await session.fetch_state())["nodes"] == nodes
        assert (await http.get("/health")).json()["sessions"] == 1  # the forged one's
