"""The inference server as an attacker meets it: no key, a wrong or an empty key, the run key on
a weight route guarded by the admin key, a cross-site page, a rebinding name; each refused with
its status and the served weights unchanged (their checksums) and generation not paused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from atroposlib.inference import InferenceSettings, create_app

pytestmark = pytest.mark.model
RUN, ADMIN = {"authorization": "Bearer run-key"}, {"authorization": "Bearer admin-key"}
WEIGHT_ROUTES = [
    ("POST", "/pause", None), ("POST", "/resume", None),
    ("POST", "/update_weights_from_disk", {"model_path": "/tmp"}),
    ("POST", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/tmp"}),
    ("POST", "/init_weight_transfer_engine", {"init_info": {"transport": "http"}}),
    ("POST", "/start_weight_update", None), ("POST", "/finish_weight_update", None),
    ("POST", "/update_weight_version", {"new_version": "7"}),
]  # fmt: skip


async def served(settings: InferenceSettings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            yield http


@pytest.fixture
async def keyed(test_model_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = InferenceSettings(
        model=str(test_model_path), api_key="run-key", admin_api_key="admin-key"
    )
    async for http in served(settings):
        yield http


@pytest.fixture
async def open_server(test_model_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async for http in served(InferenceSettings(model=str(test_model_path))):
        yield http


async def fingerprint(http: httpx.AsyncClient, headers: dict[str, str]) -> Any:
    checksums = await http.post("/weight_checker", json={"action": "checksum"}, headers=headers)
    health = (await http.get("/health")).json()
    return checksums.json()["checksums"], health["weight_version"], health["paused"]


async def test_weight_routes_need_the_admin_key_and_change_nothing_without_it(
    keyed: httpx.AsyncClient,
) -> None:
    before = await fingerprint(keyed, ADMIN)
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Bearer "}, RUN):
        for method, path, body in WEIGHT_ROUTES:
            answer = await keyed.request(method, path, json=body, headers=headers)
            assert answer.status_code == 401, (headers, path, answer.text)
            assert "admin" in answer.json()["detail"]
    assert await fingerprint(keyed, ADMIN) == before
    assert (await keyed.get("/v1/models", headers=RUN)).status_code == 200
    assert (await keyed.get("/weight_info", headers=RUN)).status_code == 200
    assert (await keyed.get("/v1/models", headers=ADMIN)).status_code == 200  # opens everything


@pytest.fixture
async def admin_only(test_model_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = InferenceSettings(model=str(test_model_path), admin_api_key="admin-key")
    async for http in served(settings):
        yield http


async def test_an_admin_key_alone_leaves_nothing_open(admin_only: httpx.AsyncClient) -> None:
    before = await fingerprint(admin_only, ADMIN)
    sampling = [("GET", "/v1/models", None), ("POST", "/tokenize", {"prompt": "hi"})]
    for headers in ({}, {"authorization": "Bearer wrong"}, RUN):
        for method, path, body in [*WEIGHT_ROUTES, *sampling]:
            answer = await admin_only.request(method, path, json=body, headers=headers)
            assert answer.status_code == 401, (headers, path, answer.text)
    assert await fingerprint(admin_only, ADMIN) == before
    assert (await admin_only.get("/v1/models", headers=ADMIN)).status_code == 200


async def test_without_a_key_a_browser_page_cannot_pause_or_replace_weights(
    open_server: httpx.AsyncClient,
) -> None:
    before = await fingerprint(open_server, {})
    for headers in ({"sec-fetch-site": "cross-site"}, {"origin": "https://evil.example"},
                    {"host": "rebind.evil.example:9001"}):  # fmt: skip
        for method, path, body in WEIGHT_ROUTES:
            answer = await open_server.request(method, path, json=body, headers=headers)
            assert answer.status_code == 403, (headers, path)
            assert "--" in answer.json()["detail"]
    assert await fingerprint(open_server, {}) == before


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"api_key": ""}, "api_key is set but empty"),
        ({"host": "0.0.0.0"}, "--insecure-no-key"),
    ],
)
def test_an_empty_key_or_an_open_bind_is_refused_at_start(
    fields: dict[str, Any], named: str, test_model_path: Path
) -> None:
    with pytest.raises(ValidationError, match=named):
        InferenceSettings(model=str(test_model_path), **fields)


def test_the_runs_shared_key_locks_the_server(
    monkeypatch: pytest.MonkeyPatch, test_model_path: Path
) -> None:
    monkeypatch.setenv("ATROPOS_API_KEY", "shared")
    assert InferenceSettings(model=str(test_model_path)).api_key == "shared"
    monkeypatch.setenv("ATROPOS_INFERENCE_API_KEY", "own")
    assert InferenceSettings(model=str(test_model_path)).api_key == "own"


def test_the_runs_admin_key_is_read_from_the_one_admin_variable(
    monkeypatch: pytest.MonkeyPatch, test_model_path: Path
) -> None:
    monkeypatch.setenv("ATROPOS_ADMIN_API_KEY", "shared-admin")
    assert InferenceSettings(model=str(test_model_path)).admin_api_key == "shared-admin"
    monkeypatch.setenv("ATROPOS_INFERENCE_ADMIN_API_KEY", "own-admin")  # the server's own name
    assert InferenceSettings(model=str(test_model_path)).admin_api_key == "own-admin"
    with pytest.raises(ValidationError, match="admin_api_key is set but empty"):
        InferenceSettings(model=str(test_model_path), admin_api_key=" ")


@pytest.mark.parametrize(
    ("fields", "without_key", "with_key"),
    [
        ({}, 404, 404),
        ({"api_key": "run-key"}, 401, 404),
        ({"expose_api_docs": True}, 200, 200),
        ({"expose_api_docs": True, "api_key": "run-key", "admin_api_key": "admin-key"}, 401, 200),
    ],
)
async def test_the_schema_routes_are_off_unless_exposed_then_behind_the_key(
    test_model_path: Path, fields: dict[str, Any], without_key: int, with_key: int
) -> None:
    app = create_app(InferenceSettings(model=str(test_model_path), **fields))
    transport = httpx.ASGITransport(app=app)  # no lifespan: the schema needs no model
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        for path in ("/openapi.json", "/docs", "/redoc"):
            assert (await http.get(path)).status_code == without_key, path
            assert (await http.get(path, headers=RUN)).status_code == with_key, path
        if with_key == 200:
            schema = (await http.get("/openapi.json", headers=RUN)).json()
            assert "/v1/chat/completions" in schema["paths"]
