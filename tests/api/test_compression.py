"""The gzip middleware of answers: what is compressed, what passes through, exact bytes back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from atroposlib.api.compression import GzipAnswers, igzip_level

BIG = b'{"tokens": [' + b"12345, " * 400 + b"1]}"


async def _plain(request: Request) -> Response:
    size = int(request.query_params.get("size", len(BIG)))
    media = request.query_params.get("type", "application/json")
    return Response(BIG[:size], media_type=media)


async def _stream(_: Request) -> StreamingResponse:
    async def chunks() -> AsyncIterator[bytes]:
        yield BIG
        yield BIG

    return StreamingResponse(chunks(), media_type="application/json")


def _client(gzip_level: int = 1) -> httpx.AsyncClient:
    app = Starlette(routes=[Route("/plain", _plain), Route("/stream", _stream)])
    wrapped = GzipAnswers(app, minimum_size=1000, gzip_level=gzip_level)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=wrapped), base_url="http://t")


async def _raw(client: httpx.AsyncClient, url: str, accept: str | None) -> httpx.Response:
    headers = {"accept-encoding": accept} if accept is not None else {"accept-encoding": ""}
    request = client.build_request("GET", url, headers=headers)
    answer = await client.send(request, stream=True)
    await answer.aread()
    return answer


@pytest.mark.parametrize("level", [1, 5, 9])
async def test_large_json_is_gzipped_and_inflates_to_the_same_bytes(level: int) -> None:
    async with _client(level) as client:
        answer = await _raw(client, "/plain", "gzip, deflate")
        assert answer.headers["content-encoding"] == "gzip"
        assert answer.headers["vary"] == "Accept-Encoding"
        raw = answer.read()  # httpx inflated it; check the header length against the wire
        assert int(answer.headers["content-length"]) < len(BIG)
        assert raw == BIG


@pytest.mark.parametrize(
    ("url", "accept"),
    [
        ("/plain?size=999", "gzip"),
        ("/plain?type=application/msgpack", "gzip"),
        ("/plain?type=image/png", "gzip"),
        ("/plain", None),
        ("/plain", "deflate"),
        ("/stream", "gzip"),
    ],
)
async def test_small_msgpack_unaccepted_and_streamed_answers_pass_unchanged(
    url: str, accept: str | None
) -> None:
    async with _client() as client:
        answer = await _raw(client, url, accept)
        assert "content-encoding" not in answer.headers
        assert answer.status_code == 200
        expected = BIG * 2 if url == "/stream" else BIG[: 999 if "999" in url else len(BIG)]
        assert answer.content == expected


def test_gzip_levels_map_onto_igzip_levels() -> None:
    assert [igzip_level(level) for level in range(1, 10)] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
