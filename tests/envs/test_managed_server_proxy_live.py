"""The proxy on a real uvicorn (a free loopback port) as an attacker meets it: no key, a wrong or
an empty key, another session's id, a cross-site page, a rebinding name, one client taking every
session, a session past its byte cap. Each refused with its status (each limit named in its 429)
and the sessions' contents unchanged; the owner's own session keeps working throughout."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from proxy_testlib import ScriptedEngine, proxy_app
from transformers import AutoTokenizer

from tests.fakes import uvicorn_on_loopback

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


def contents(http: httpx.Client, session: str) -> list[Any]:
    answer = http.get(f"/{session}/nodes", headers=KEY)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["nodes"])


def test_without_the_key_or_with_another_id_nothing_changes(keyed: httpx.Client) -> None:
    mine = keyed.post("/sessions/create", json={}, headers=KEY).json()["uuid"]
    assert keyed.post(f"/{mine}/v1/chat/completions", json=USER, headers=KEY).status_code == 200
    before = contents(keyed, mine)
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
    for method, path in (("GET", f"/{other}/nodes"), ("DELETE", f"/{other}"),
                         ("POST", f"/{other}/v1/chat/completions")):  # fmt: skip
        answer = keyed.request(method, path, json=USER if method == "POST" else None, headers=KEY)
        assert answer.status_code == 404, (path, answer.text)
    assert contents(keyed, mine) == before
    assert keyed.get("/health").json()["sessions"] == 1


def test_limits_name_themselves_and_leave_the_session_alone(keyed: httpx.Client) -> None:
    first = keyed.post("/sessions/create", json={}, headers=KEY).json()["uuid"]
    assert keyed.post("/sessions/create", json={}, headers=KEY).status_code == 200
    third = keyed.post("/sessions/create", json={}, headers=KEY)
    assert third.status_code == 429 and "max_sessions_per_client" in third.json()["detail"]
    long = {"messages": [{"role": "user", "content": "Say more. " * 200}]}
    assert keyed.post(f"/{first}/v1/chat/completions", json=long, headers=KEY).status_code == 200
    before = contents(keyed, first)
    full = keyed.post(f"/{first}/v1/chat/completions", json=USER, headers=KEY)
    assert full.status_code == 429 and "max_session_bytes" in full.json()["detail"]
    assert contents(keyed, first) == before


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
