"""The weight-update control API over HTTP (the app in process, the real small model): the
phases in order, each bad call answered 4xx naming the field, the served weights untouched."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import save as safetensors_bytes

from atroposlib.inference import InferenceSettings, create_app
from atroposlib.wire.engine import UPDATE_TOKEN_HEADER

pytestmark = pytest.mark.model

NAME = "model.norm.weight"
OCTETS = {"content-type": "application/octet-stream"}


@pytest.fixture
async def client(test_model_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(InferenceSettings(model=str(test_model_path), threads=1))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield http


async def checksums(client: httpx.AsyncClient) -> dict[str, str]:
    answer = await client.post("/weight_checker", json={"action": "checksum"})
    return dict(answer.json()["checksums"])


def chunk(**tensors: torch.Tensor) -> bytes:
    return safetensors_bytes({name.replace("__", "."): t for name, t in tensors.items()})


async def test_bad_calls_name_the_field_and_leave_the_weights_alone(
    client: httpx.AsyncClient,
) -> None:
    before = await checksums(client)
    norm = torch.ones(576)

    async def refused(path: str, status: int, field: str, **request: object) -> None:
        answer = await client.post(path, **request)  # type: ignore[arg-type]
        assert answer.status_code == status, answer.text
        assert field in answer.json()["detail"], answer.text

    await refused("/start_weight_update", 409, "transport")
    await client.post("/init_weight_transfer_engine", json={"init_info": {"transport": "http"}})
    await refused("/update_weights", 409, "start_weight_update", content=b"x", headers=OCTETS)
    started = await client.post("/start_weight_update")
    assert started.status_code == 200
    owner = {UPDATE_TOKEN_HEADER: started.json()["update_token"]}
    await refused("/start_weight_update", 409, "already active")
    shm = {"update_info": {"names": [NAME], "dtype_names": ["float32"], "shapes": [[576]],
                           "shm_name": "../etc/passwd", "shm_bytes": 2304}}  # fmt: skip
    await refused("/update_weights", 400, "content-type", json=shm, headers=owner)
    await refused("/update_weights", 400, "content-type", content=b"x", headers=owner)
    await refused("/update_weights", 400, "model.nope", content=chunk(model__nope=norm),
                  headers=OCTETS | owner)  # fmt: skip
    await refused("/update_weights", 400, NAME, content=chunk(model__norm__weight=torch.ones(3)),
                  headers=OCTETS | owner)  # fmt: skip
    await refused("/finish_weight_update", 422, "weight_version", json={"weight_version": "v2"},
                  headers=owner)  # fmt: skip
    await refused("/weight_checker", 422, "baseline", json={"action": "compare"})
    assert (await client.get("/weight_info")).json() == {"weight_version": "0"}
    assert await checksums(client) == before

    # the same update, right this time: only the one tensor changes, under the given version
    ok = await client.post(
        "/update_weights", content=chunk(model__norm__weight=norm), headers=OCTETS | owner
    )
    assert ok.status_code == 200 and ok.json()["tensors"] == 1
    done = await client.post("/finish_weight_update", json={"weight_version": "5"}, headers=owner)
    assert done.json()["weight_version"] == "5"
    after = await checksums(client)
    assert {n for n in before if before[n] != after[n]} == {NAME}
    compare = await client.post("/weight_checker", json={"action": "compare", "baseline": after})
    assert compare.json() == {"match": True, "mismatches": []}
    assert (await client.get("/get_weight_version")).json() == {"weight_version": "5"}


async def test_pause_resume_and_version_label(client: httpx.AsyncClient) -> None:
    assert (await client.get("/is_paused")).json() == {"is_paused": False}
    for mode in ("keep", "wait", "abort"):
        assert (await client.post("/pause", params={"mode": mode})).status_code == 200
        assert (await client.get("/is_paused")).json() == {"is_paused": True}
        assert (await client.get("/health")).json()["paused"] == mode
        assert (await client.post("/resume")).status_code == 200
    assert (await client.post("/pause", params={"mode": "later"})).status_code == 422
    assert (await client.get("/is_paused")).json() == {"is_paused": False}
    labelled = await client.post("/update_weight_version", json={"new_version": "9"})
    assert labelled.json()["weight_version"] == "9"
    assert (await client.get("/weight_info")).json() == {"weight_version": "9"}
    reset = await client.post("/reset_prefix_cache", params={"reset_running_requests": "true"})
    assert reset.json() == {"success": True}


async def test_health_reports_the_pause_as_soon_as_pause_answers(test_model_path: Path) -> None:
    # The scheduler's counts are recorded after its steps; with that recording held back (as on
    # a busy machine, where the HTTP answer can come before it) /health must still say paused.
    app = create_app(InferenceSettings(model=str(test_model_path), threads=1))
    async with app.router.lifespan_context(app):
        scheduler = app.state.inference.scheduler
        scheduler._record_stats = lambda: None
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            assert (await http.post("/pause", params={"mode": "keep"})).status_code == 200
            assert (await http.get("/health")).json()["paused"] == "keep"
            assert (await http.post("/resume")).status_code == 200
            assert (await http.get("/health")).json()["paused"] is None


async def test_an_update_belongs_to_whoever_started_it(test_model_path: Path) -> None:
    settings = InferenceSettings(model=str(test_model_path), threads=1, weight_update_idle_s=0.5)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            before = await checksums(client)
            await client.post("/init_weight_transfer_engine", json={})
            owner = {UPDATE_TOKEN_HEADER: (await client.post("/start_weight_update")).json()[
                "update_token"]}  # fmt: skip
            body = chunk(model__norm__weight=torch.zeros(576))
            for other in ({}, {UPDATE_TOKEN_HEADER: "guessed"}, {UPDATE_TOKEN_HEADER: ""}):
                for path, request in (
                    ("/update_weights", {"content": body, "headers": OCTETS | other}),
                    ("/finish_weight_update", {"json": {"weight_version": "3"}, "headers": other}),
                    ("/start_weight_update", {"headers": other}),
                    ("/init_weight_transfer_engine", {"json": {}, "headers": other}),
                ):
                    answer = await client.post(path, **request)  # type: ignore[arg-type]
                    assert answer.status_code == 409, (path, other, answer.text)
            assert await checksums(client) == before
            assert (await client.get("/weight_info")).json() == {"weight_version": "0"}

            # bounded uploads: a chunk beyond the limit is refused, naming the setting
            app.state.inference.uploads = settings.max_concurrent_weight_uploads
            busy = await client.post("/update_weights", content=body, headers=OCTETS | owner)
            assert busy.status_code == 429 and "max_concurrent_weight_uploads" in busy.text
            app.state.inference.uploads = 0
            staged = await client.post("/update_weights", content=body, headers=OCTETS | owner)
            again = await client.post("/update_weights", content=body, headers=OCTETS | owner)
            assert staged.status_code == again.status_code == 200
            assert app.state.inference.staging.staged_bytes == 576 * 4  # replaced, not piled up

            # idle past --weight-update-idle-s, the update may be taken over; its token is void
            await asyncio.sleep(0.6)
            taken = await client.post("/start_weight_update")
            assert taken.status_code == 200, taken.text
            late = await client.post("/finish_weight_update", headers=owner)
            assert late.status_code == 409
            assert await checksums(client) == before
