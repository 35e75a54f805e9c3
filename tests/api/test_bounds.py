"""Numbers past their documented range get 422 naming the field, and never brick the store.

Each bad request goes to a real broker process on a durable store; the broker is then killed
(-9) and started again on that store, which must open and keep serving what was queued.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from broker_testlib import BrokerProcess, env_body, make_group, trainer_body

from atroposlib.bounds import MAX_STEP

pytestmark = pytest.mark.slow

BIG = 2**63
NAN = float("nan")
INF = float("inf")

# (method, path, query, body, field named in the 422)
BAD_REQUESTS: list[tuple[str, str, dict[str, Any], Any, str]] = [
    ("POST", "/register", {}, trainer_body(starting_step=BIG - 1), "starting_step"),
    ("POST", "/register", {}, trainer_body(starting_step=MAX_STEP + 1), "starting_step"),
    ("POST", "/register", {}, trainer_body(batch_size=NAN), "batch_size"),
    ("POST", "/register", {}, trainer_body(num_steps=INF), "num_steps"),
    ("POST", "/register", {}, trainer_body(max_staleness=BIG), "max_staleness"),
    ("POST", "/register", {}, trainer_body(wandb_group="g" * 5000), "wandb_group"),
    ("POST", "/register-env", {}, env_body(weight=NAN), "weight"),
    ("POST", "/register-env", {}, env_body(weight=INF), "weight"),
    ("POST", "/register-env", {}, env_body(weight=1e300), "weight"),
    ("POST", "/register-env", {}, env_body(group_size=BIG), "group_size"),
    ("POST", "/register-env", {}, env_body(max_token_length=-BIG), "max_token_length"),
    ("POST", "/ack", {}, {"step": BIG}, "step"),
    ("POST", "/ack", {}, {"step": NAN}, "step"),
    ("POST", "/disconnect-env", {}, {"env_id": 2**70}, "env_id"),
    ("POST", "/scored_data", {}, make_group(policy_version=BIG), "policy_version"),
    ("POST", "/scored_data", {}, make_group(policy_version=MAX_STEP + 1), "policy_version"),
    ("POST", "/scored_data", {}, make_group(env_id=2**64), "env_id"),
    ("POST", "/scored_data_list", {}, [make_group(policy_version=2**70)], "policy_version"),
    ("GET", "/status-env", {"env_id": str(2**70)}, None, "env_id"),
    ("GET", "/recent_groups", {"limit": str(BIG)}, None, "limit"),
    ("GET", "/batch", {"received": str(BIG)}, None, "received"),
]


def _send(url: str, method: str, path: str, query: dict[str, Any], body: Any) -> httpx.Response:
    content = None if body is None else json.dumps(body).encode()  # NaN as Python sends it
    return httpx.request(
        method, url + path, params=query, content=content,
        headers={"content-type": "application/json"}, timeout=10,
    )  # fmt: skip


def _names(answer: httpx.Response, field: str) -> bool:
    detail = answer.json()["detail"]
    if isinstance(detail, str):
        return field in detail.split(":")[0]
    return any(field in map(str, error["loc"]) for error in detail)


def test_out_of_range_numbers_are_422_and_the_store_reopens(
    broker_process: Callable[..., BrokerProcess],
) -> None:
    broker = broker_process()
    assert httpx.post(f"{broker.url}/register", json=trainer_body(batch_size=2)).is_success
    assert httpx.get(f"{broker.url}/batch").json()["batch"] is None
    env_id = httpx.post(f"{broker.url}/register-env", json=env_body()).json()["env_id"]
    for queued, (method, path, query, body, field) in enumerate(BAD_REQUESTS, start=1):
        answer = _send(broker.url, method, path, query, body)
        assert answer.status_code == 422, (path, body, answer.text)
        assert _names(answer, field), (path, field, answer.json())
        good = make_group(1, marker=queued, env_id=env_id)
        assert httpx.post(f"{broker.url}/scored_data", json=good).is_success
        broker.kill9()
        broker.start()  # the same store: it must open
        assert httpx.get(f"{broker.url}/status").json()["queue_size"] == queued, path
    batch = httpx.get(f"{broker.url}/batch").json()
    assert batch["batch"] is not None and batch["step"] >= 1


def test_largest_documented_values_are_accepted_and_survive_a_restart(
    broker_process: Callable[..., BrokerProcess],
) -> None:
    broker = broker_process()
    start = MAX_STEP - 5
    body = trainer_body(batch_size=1, starting_step=start, max_staleness=MAX_STEP)
    assert httpx.post(f"{broker.url}/register", json=body).is_success
    httpx.get(f"{broker.url}/batch")
    env_id = httpx.post(f"{broker.url}/register-env", json=env_body(weight=1e9)).json()["env_id"]
    group = make_group(1, env_id=env_id, policy_version=MAX_STEP)
    assert httpx.post(f"{broker.url}/scored_data", json=group).is_success
    assert httpx.get(f"{broker.url}/batch").json()["step"] == start + 1
    assert httpx.post(f"{broker.url}/ack", json={"step": MAX_STEP}).is_success
    broker.kill9()
    broker.start()
    assert httpx.get(f"{broker.url}/status").json()["current_step"] == start + 1


def test_non_ascii_bearer_token_is_401(broker_process: Callable[..., BrokerProcess]) -> None:
    broker = broker_process(api_key="sekret")
    for path in ("/status", "/batch"):
        answer = httpx.get(
            f"{broker.url}{path}", headers={"authorization": "Bearer s\u00e9kr\u00eat".encode()}
        )
        assert answer.status_code == 401, answer.text
