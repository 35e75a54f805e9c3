"""A batch whose answer never reached an acknowledging trainer is sent again, in order.

The broker is a real process; a lost answer is a real ``GET /batch`` whose response the
client's transport throws away (as a timeout or a proxy reset does), or one answered just
before the broker is killed.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from broker_testlib import BrokerProcess, make_group, markers, trainer_body

from atroposlib.client import TrainerClient
from atroposlib.errors import BrokerUnavailableError
from atroposlib.wire.broker import TrainerRegistration


class LosingTransport(httpx.HTTPTransport):
    """Real HTTP; the answers of the next ``lose`` GET /batch calls are dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.lose = 0
        self.queries: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.url.path == "/batch":
            self.queries.append(request.url.query.decode())
            if self.lose:
                self.lose -= 1
                response.read()
                raise httpx.ReadTimeout("answer lost on the way", request=request)
        return response


def _trainer(url: str, acknowledges: bool) -> tuple[TrainerClient, LosingTransport]:
    transport = LosingTransport()
    client = TrainerClient(url, http_client=httpx.Client(transport=transport), encoding="json")
    client.register(
        TrainerRegistration.model_validate(trainer_body(batch_size=2, acknowledges=acknowledges))
    )
    return client, transport


def _post(url: str, *marks: int) -> None:
    for mark in marks:
        assert httpx.post(f"{url}/scored_data", json=make_group(2, marker=mark)).is_success


def _got(client: TrainerClient) -> tuple[int | None, list[int]]:
    batch = client.get_batch()
    assert batch is not None
    return batch.step, markers(batch.groups)


@pytest.mark.slow
def test_lost_answers_are_sent_again_in_order_before_new_data(
    broker_process: Callable[..., BrokerProcess],
) -> None:
    broker = broker_process()
    client, transport = _trainer(broker.url, acknowledges=True)
    _post(broker.url, 100, 200, 300, 400, 500)
    transport.lose = 2
    for _ in range(2):
        with pytest.raises(BrokerUnavailableError):
            client.get_batch()  # batches 1 and 2 formed, both answers lost
    assert _got(client) == (1, [100, 101])
    assert _got(client) == (2, [200, 201])
    assert _got(client) == (3, [300, 301])
    assert transport.queries == [*["received=0"] * 3, "received=1", "received=2"]
    # an answer lost because the broker died right after forming the batch
    assert httpx.get(f"{broker.url}/batch").json()["step"] == 4
    broker.kill9()
    broker.start()
    assert _got(client) == (4, [400, 401])
    assert _got(client) == (5, [500, 501])
    assert client.get_batch() is None
    client.ack(5)
    assert httpx.get(f"{broker.url}/metrics").text.count("broker_batches_resent_total 3.0") == 1


@pytest.mark.slow
def test_trainers_that_do_not_acknowledge_keep_todays_behaviour(
    broker_process: Callable[..., BrokerProcess],
) -> None:
    broker = broker_process()
    client, transport = _trainer(broker.url, acknowledges=False)
    _post(broker.url, 100, 200)
    transport.lose = 1
    with pytest.raises(BrokerUnavailableError):
        client.get_batch()
    assert _got(client) == (2, [200, 201])  # Atropos's trainer: each batch is handed out once
    assert transport.queries == ["", ""]


def test_received_must_be_a_step(broker_process: Callable[..., BrokerProcess]) -> None:
    broker = broker_process()
    httpx.post(f"{broker.url}/register", json=trainer_body())
    for bad in ("-1", "x", "1.5", str(2**63), ""):
        answer = httpx.get(f"{broker.url}/batch", params={"received": bad})
        assert answer.status_code == 422, (bad, answer.text)
        assert answer.json()["detail"].startswith("received:")
