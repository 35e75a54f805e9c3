"""A browser cannot change (or read) a broker on another site's behalf; real clients can.

Every case runs against a real broker process: a cross-site request (``Sec-Fetch-Site`` or
``Origin``) or a DNS-rebinding one (a foreign name in ``Host``) is refused with 403 before it
touches anything, on the fast routes too, while clients that send none of these headers (as
Atropos's do, ``GET /reset_data`` included) keep working.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from broker_testlib import BrokerProcess, make_group, trainer_body

pytestmark = pytest.mark.slow

BROWSER_ATTACKS: list[tuple[str, str, dict[str, str]]] = [
    ("GET", "/reset_data", {"sec-fetch-site": "cross-site"}),  # <img src=...>
    ("GET", "/reset_data", {"sec-fetch-site": "same-site"}),  # a page on another local port
    ("GET", "/reset_data", {"origin": "https://evil.example"}),
    ("GET", "/reset_data", {"host": "rebind.evil.example:8000"}),
    ("POST", "/register", {"origin": "null", "sec-fetch-site": "cross-site"}),
    ("POST", "/scored_data", {"origin": "https://evil.example", "sec-fetch-site": "cross-site"}),
    ("POST", "/scored_data_list", {"sec-fetch-site": "cross-site"}),
    ("GET", "/batch", {"sec-fetch-site": "cross-site"}),
    ("GET", "/batch", {"host": "rebind.evil.example"}),
    ("GET", "/latest_example", {"host": "rebind.evil.example"}),
    ("POST", "/ack", {"origin": "http://localhost:3000"}),
]


def _queued(url: str) -> int:
    return int(httpx.get(f"{url}/status").json()["queue_size"])


def _fill(url: str) -> None:
    assert httpx.post(f"{url}/register", json=trainer_body(batch_size=8)).is_success
    for mark in range(3):
        assert httpx.post(f"{url}/scored_data", json=make_group(2, marker=mark)).is_success


def test_cross_site_and_rebinding_requests_are_refused(
    broker_process: Callable[..., BrokerProcess],
) -> None:
    broker = broker_process()
    _fill(broker.url)
    for method, path, headers in BROWSER_ATTACKS:
        body = make_group() if path.startswith("/scored_data") else trainer_body()
        if path == "/scored_data_list":
            body = [body]
        content = None if method == "GET" else httpx.Request("POST", "/", json=body).read()
        answer = httpx.request(
            method, broker.url + path, headers={**headers, "content-type": "application/json"},
            content=content,
        )  # fmt: skip
        assert answer.status_code == 403, (path, headers, answer.text)
        assert "--" in answer.json()["detail"]  # names the setting that allows it
        assert _queued(broker.url) == 3, (path, headers)
    # the browser's own page (Swagger UI on /docs) is same-origin, under any local name
    for host in (f"127.0.0.1:{broker.port}", f"localhost:{broker.port}"):
        same_origin = {"host": host, "origin": f"http://{host}", "sec-fetch-site": "same-origin"}
        answer = httpx.post(f"{broker.url}/scored_data", json=make_group(), headers=same_origin)
        assert answer.status_code == 200, answer.text
    # Atropos's clients: no Sec-Fetch-Site, no Origin, GET /reset_data
    answer = httpx.get(f"{broker.url}/reset_data", headers={"user-agent": "python-requests/2"})
    assert answer.status_code == 200 and answer.text == "Reset successful"
    assert _queued(broker.url) == 0


def test_listed_origins_and_hosts_are_let_through(
    broker_process: Callable[..., BrokerProcess],
) -> None:
    broker = broker_process(
        "--cors-origins", '["https://ok.example"]', "--allowed-hosts", '["broker.internal"]'
    )
    _fill(broker.url)
    allowed = {"origin": "https://ok.example", "sec-fetch-site": "cross-site"}
    answer = httpx.post(f"{broker.url}/scored_data", json=make_group(), headers=allowed)
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"]
    named = httpx.get(f"{broker.url}/status", headers={"host": "broker.internal:1234"})
    assert named.status_code == 200
    foreign = {"origin": "https://evil.example", "sec-fetch-site": "cross-site"}
    assert httpx.get(f"{broker.url}/reset_data", headers=foreign).status_code == 403
    assert _queued(broker.url) == 4


def test_with_an_api_key_nothing_changes_without_it(
    broker_process: Callable[..., BrokerProcess],
) -> None:
    broker = broker_process(api_key="sekret")
    key = {"authorization": "Bearer sekret"}
    assert httpx.post(f"{broker.url}/register", json=trainer_body(), headers=key).is_success
    assert httpx.post(f"{broker.url}/scored_data", json=make_group(), headers=key).is_success
    for method, path, headers in BROWSER_ATTACKS:
        assert httpx.request(method, broker.url + path, headers=headers).status_code == 401
    # a client with the key may use any name (a reverse proxy, a service name)
    proxied = {**key, "host": "broker.svc.cluster.local"}
    assert httpx.get(f"{broker.url}/status", headers=proxied).json()["queue_size"] == 1
