"""Request size limits: the body-size middleware and the sequences x tokens check."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, HTTPException, Request

from atroposlib.inference.limits import BodySizeLimit, check_request_size
from atroposlib.inference.settings import InferenceSettings


@pytest.fixture
def settings(tmp_path: Path) -> InferenceSettings:
    return InferenceSettings(
        model=str(tmp_path), max_request_sequences=64, max_request_tokens=1000, max_body_bytes=2048
    )


@pytest.fixture
async def echo(settings: InferenceSettings) -> AsyncIterator[httpx.AsyncClient]:
    app = FastAPI()
    chunks = {"/update_weights": (4096, "--max-weight-chunk-bytes")}
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes, per_path=chunks)

    @app.post("/echo")
    @app.post("/update_weights")
    async def echo_length(request: Request) -> dict[str, int]:
        return {"length": len(await request.body())}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


async def test_bodies_over_the_limit_get_413_with_or_without_content_length(
    echo: httpx.AsyncClient,
) -> None:
    fits = await echo.post("/echo", content=b"x" * 2048)
    assert fits.status_code == 200 and fits.json() == {"length": 2048}
    declared = await echo.post("/echo", content=b"x" * 2049)
    assert declared.status_code == 413 and "--max-body-bytes" in declared.json()["detail"]

    async def chunks() -> AsyncIterator[bytes]:  # chunked: no Content-Length to trust
        for _ in range(5):
            yield b"y" * 1000

    streamed = await echo.post("/echo", content=chunks())
    assert streamed.status_code == 413 and streamed.json()["detail"].startswith("body:")


async def test_weight_chunks_have_their_own_limit(echo: httpx.AsyncClient) -> None:
    fits = await echo.post("/update_weights", content=b"x" * 4096)
    assert fits.status_code == 200 and fits.json() == {"length": 4096}
    over = await echo.post("/update_weights", content=b"x" * 4097)
    assert over.status_code == 413 and "--max-weight-chunk-bytes" in over.json()["detail"]
    assert "sync_chunk_mb" in over.json()["detail"]


@pytest.mark.parametrize(
    ("max_new", "n", "named"),
    [
        ([10] * 8, 8, None),  # 64 sequences, 640 tokens
        ([10] * 9, 8, "prompt, n"),  # 72 sequences
        ([500, 1], 2, "max_tokens"),  # 1002 tokens
        ([1000], 1, None),
    ],
)
def test_sequences_and_tokens_per_request(
    settings: InferenceSettings, max_new: list[int], n: int, named: str | None
) -> None:
    if named is None:
        check_request_size(settings, "prompt", max_new, n, "max_tokens")
        return
    with pytest.raises(HTTPException) as refused:
        check_request_size(settings, "prompt", max_new, n, "max_tokens")
    assert refused.value.status_code == 413
    assert str(refused.value.detail).startswith(f"{named}:")
