"""The per-group routes served straight from ASGI: disconnects, crashes, compression."""

from __future__ import annotations

import gzip
from typing import Any

import orjson
import pytest
from broker_testlib import make_group, trainer_body

from atroposlib.api.app import create_app
from atroposlib.api.settings import BrokerSettings


async def _call(app: Any, method: str, path: str, messages: list[dict[str, Any]]) -> list[dict]:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000),
        "headers": [(b"content-type", b"application/json"), (b"accept-encoding", b"gzip")],
    }  # fmt: skip
    sent: list[dict] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def _body(data: bytes) -> dict[str, Any]:
    return {"type": "http.request", "body": data, "more_body": False}


async def test_disconnect_mid_body_queues_nothing_and_answers_nothing() -> None:
    app = create_app(BrokerSettings(store="memory"))
    async with app.router.lifespan_context(app):
        await _call(app, "POST", "/register", [_body(orjson.dumps(trainer_body()))])
        half = orjson.dumps(make_group())[:20]
        chunks = [{"type": "http.request", "body": half, "more_body": True},
                  {"type": "http.disconnect"}]  # fmt: skip
        assert await _call(app, "POST", "/scored_data", chunks) == []
        status = await _call(app, "GET", "/status", [_body(b"")])
        assert orjson.loads(status[1]["body"])["queue_size"] == 0


async def test_an_unexpected_failure_answers_500_json_and_is_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = create_app(BrokerSettings(store="memory"))
    async with app.router.lifespan_context(app):
        from atroposlib.api.broker import Broker

        def broken(*_: Any, **__: Any) -> None:
            raise RuntimeError("disk on fire")

        monkeypatch.setattr(Broker, "ingest", broken)
        sent = await _call(app, "POST", "/scored_data", [_body(orjson.dumps(make_group()))])
        assert sent[0]["status"] == 500
        assert orjson.loads(sent[1]["body"]) == {"detail": "Internal Server Error"}
        assert "disk on fire" in caplog.text


async def test_large_batches_are_gzipped_with_a_correct_length() -> None:
    app = create_app(BrokerSettings(store="memory"))
    async with app.router.lifespan_context(app):
        await _call(
            app,
            "POST",
            "/register",
            [_body(orjson.dumps(trainer_body(batch_size=2, max_token_len=512)))],
        )
        await _call(app, "GET", "/batch", [_body(b"")])
        group = make_group(2, length=400)
        await _call(app, "POST", "/scored_data", [_body(orjson.dumps(group))])
        start, body = await _call(app, "GET", "/batch", [_body(b"")])
        headers = dict(start["headers"])
        assert headers[b"content-encoding"] == b"gzip"
        assert int(headers[b"content-length"]) == len(body["body"])
        batch = orjson.loads(gzip.decompress(body["body"]))
        assert batch["batch"][0]["tokens"] == group["tokens"]
