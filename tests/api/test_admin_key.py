"""The broker with two keys, as launchers start it: environments hold the run key, the trainer
the admin key. A run-key holder posts groups, registers its env and reads the status; it cannot
register a trainer, take or acknowledge batches, or reset the queue, and each refusal leaves
the queue and the registration as they were. With only an admin key, nothing is open."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from broker_testlib import BrokerProcess, env_body, in_process, make_group, markers, trainer_body

from atroposlib.api.settings import BrokerSettings

RUN, ADMIN = {"authorization": "Bearer run-key"}, {"authorization": "Bearer admin-key"}
NOT_ADMIN = [{}, {"authorization": "Bearer wrong"}, RUN]
TRAINER_ROUTES: list[tuple[str, str, Any]] = [
    ("POST", "/register", trainer_body(batch_size=2)),
    ("GET", "/batch", None),
    ("POST", "/ack", {"step": 1}),
    ("GET", "/reset_data", None),
]
RUN_ROUTES: list[tuple[str, str, Any]] = [
    ("GET", "/status", None), ("GET", "/info", None), ("GET", "/health", None),
    ("GET", "/latest_example", None), ("GET", "/recent_groups", None),
]  # fmt: skip


def state(request: Callable[..., httpx.Response]) -> tuple[Any, ...]:
    """What a refused trainer route could have changed: the queue, the step, the registration."""
    status = request("GET", "/status", headers=ADMIN).json()
    info = request("GET", "/info", headers=ADMIN).json()
    return status["queue_size"], status["current_step"], info["batch_size"]


def test_the_run_key_posts_groups_but_cannot_take_batches_register_or_reset(
    broker_process: Callable[..., BrokerProcess],
) -> None:
    broker = broker_process(api_key="run-key", admin_key="admin-key")
    with httpx.Client(base_url=broker.url, timeout=10) as http:
        assert http.post("/register", json=trainer_body(), headers=ADMIN).is_success
        assert http.post("/register-env", json=env_body(), headers=RUN).status_code == 200
        for group in [make_group(marker=100 * i) for i in range(1, 4)]:
            assert http.post("/scored_data", json=group, headers=RUN).is_success
        assert http.post("/scored_data_list", json=[make_group(marker=900)], headers=RUN).is_success
        for _, path, _ in RUN_ROUTES:
            assert http.get(path, headers=RUN).status_code == 200, path
        before = state(http.request)
        assert before == (4, 0, 4)
        for headers in NOT_ADMIN:
            for method, path, body in TRAINER_ROUTES:
                answer = http.request(method, path, json=body, headers=headers)
                assert answer.status_code == 401, (headers, path, answer.text)
                assert answer.headers["www-authenticate"] == "Bearer"
        assert "admin" in http.get("/batch", headers=RUN).json()["detail"]
        assert state(http.request) == before
        # the trainer, with the admin key, gets every group the envs posted, then resets
        batch = http.get("/batch", headers=ADMIN).json()
        assert sorted(markers(batch["batch"])) == [100, 101, 200, 201]
        assert http.get("/reset_data", headers=ADMIN).status_code == 200


def test_an_admin_key_alone_leaves_nothing_open(
    broker_process: Callable[..., BrokerProcess],
) -> None:
    broker = broker_process(admin_key="admin-key")
    with httpx.Client(base_url=broker.url, timeout=10) as http:
        assert http.post("/scored_data", json=make_group(), headers=ADMIN).is_success
        for headers in NOT_ADMIN:
            for method, path, body in [*TRAINER_ROUTES, *RUN_ROUTES,
                                       ("POST", "/scored_data", make_group(marker=5))]:  # fmt: skip
                answer = http.request(method, path, json=body, headers=headers)
                assert answer.status_code == 401, (headers, path)
            assert http.get("/openapi.json", headers=headers).status_code in (401, 404)
        assert http.get("/status", headers=ADMIN).json()["queue_size"] == 1


@pytest.mark.parametrize("cors", [[], ["https://viewer.example"]])
async def test_the_batch_route_needs_the_admin_key_on_the_fast_and_the_full_path(
    cors: list[str],
) -> None:
    """With CORS origins the per-group routes go through FastAPI's stack instead."""
    settings = BrokerSettings(
        store="memory", api_key="run-key", admin_api_key="admin-key", cors_origins=cors
    )
    async with in_process(settings) as http:
        assert (await http.post("/register", json=trainer_body(), headers=ADMIN)).is_success
        for marker in (10, 20):
            posted = await http.post("/scored_data", json=make_group(marker=marker), headers=RUN)
            assert posted.is_success
        refused = await http.get("/batch", headers=RUN)
        assert refused.status_code == 401 and "admin" in refused.json()["detail"]
        assert (await http.get("/status", headers=RUN)).json()["queue_size"] == 2
        batch = (await http.get("/batch", headers=ADMIN)).json()["batch"]
        assert sorted(markers(batch)) == [10, 11, 20, 21]
