"""Atropos reports about the broker's HTTP routes (register: docs/atropos-reports.md), each
against our broker served by a real uvicorn on a free port."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI, Request, Response

from atroposlib.api.app import create_app
from atroposlib.api.settings import BrokerSettings
from atroposlib.client import EnvClient
from tests.api.broker_testlib import env_body, make_group, trainer_body
from tests.fakes import uvicorn_on_loopback


@pytest.fixture
def broker() -> Iterator[str]:
    with uvicorn_on_loopback(create_app(BrokerSettings(store="memory"))) as url:
        yield url


def body_dropping_proxy(upstream: str) -> FastAPI:
    """A reverse proxy that forwards a GET without its body, as nginx, CDNs and load
    balancers in front of a broker do (RFC 9110 gives a GET body no meaning)."""
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        body = b"" if request.method == "GET" else await request.body()
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in ("host", "content-length")}  # fmt: skip
        async with httpx.AsyncClient() as client:
            answer = await client.request(request.method, f"{upstream}/{path}", content=body,
                                          params=request.query_params, headers=headers)  # fmt: skip
        return Response(answer.content, answer.status_code, media_type="application/json")

    return app


def start(url: str, *group_sizes: int, batch_size: int = 8) -> None:
    assert httpx.post(f"{url}/register", json=trainer_body(batch_size=batch_size)).is_success
    assert httpx.get(f"{url}/batch").json()["batch"] is None
    for size in group_sizes:
        answer = httpx.post(f"{url}/register-env", json=env_body(group_size=size)).json()
        assert answer["status"] == "success"


def test_449_status_env_by_query_parameter_and_by_atropos_s_json_body(broker: str) -> None:
    start(broker, 2)
    by_query = httpx.get(f"{broker}/status-env", params={"env_id": 0})
    by_body = httpx.request("GET", f"{broker}/status-env", json={"env_id": 0})
    assert by_query.status_code == by_body.status_code == 200
    assert by_query.json() == by_body.json()
    assert httpx.get(f"{broker}/status-env", params={"env_id": 9}).status_code == 404


async def test_449_our_env_client_reaches_status_env_through_a_proxy_that_drops_get_bodies(
    broker: str,
) -> None:
    start(broker, 2)
    assert httpx.post(f"{broker}/scored_data", json=make_group(2, env_id=0)).is_success
    with uvicorn_on_loopback(body_dropping_proxy(broker)) as proxy:
        async with EnvClient(proxy, encoding="json") as client:
            status = await client.status_env(0)
    assert status.self_queue_size == 1 and status.queue_size == 1


def test_488_other_envs_queued_data_counts_when_every_group_has_one_sequence(
    broker: str,
) -> None:
    start(broker, 1, 1)
    for marker in (10, 20, 30):
        group = make_group(1, marker=marker, env_id=1)
        assert httpx.post(f"{broker}/scored_data", json=group).is_success
    asking = httpx.get(f"{broker}/status-env", params={"env_id": 0}).json()
    assert asking["max_group_size"] == 1
    assert asking["self_queue_size"] == 0 and asking["queue_size"] == 3
    own = httpx.get(f"{broker}/status-env", params={"env_id": 1}).json()
    assert own["self_queue_size"] == own["queue_size"] == 3


def test_459_a_full_queue_answers_503_and_takes_data_again_once_drained() -> None:
    settings = BrokerSettings(store="memory", max_queued_groups=2, retry_after_seconds=3)
    with uvicorn_on_loopback(create_app(settings)) as url:
        start(url, 2, batch_size=4)
        for marker in (10, 20):
            assert httpx.post(f"{url}/scored_data", json=make_group(marker=marker)).is_success
        full = httpx.post(f"{url}/scored_data", json=make_group(marker=30))
        assert full.status_code == 503 and full.headers["retry-after"] == "3"
        assert "queue" in full.json()["detail"]
        assert httpx.get(f"{url}/status").json()["queue_size"] == 2
        assert len(httpx.get(f"{url}/batch").json()["batch"]) == 2
        assert httpx.post(f"{url}/scored_data", json=make_group(marker=30)).is_success
