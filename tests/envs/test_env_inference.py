"""ServerManager against real fake-server processes: failures, hangs, garbage, recovery."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from envs_testlib import Process, fake_inference, set_mode

from atroposlib.envs.server_handling.circuit import CircuitState
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.errors import InferenceRejectedError, InferenceUnavailableError

CHAT = [{"role": "user", "content": "What is 1+0?"}]


@pytest.fixture(scope="module")
def fake_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Process]]:
    folder = tmp_path_factory.mktemp("fakes")
    processes = [fake_inference(folder).start() for _ in range(2)]
    yield processes
    for process in processes:
        process.stop()


@pytest.fixture
def fakes(fake_processes: list[Process]) -> list[Process]:
    for process in fake_processes:
        httpx.post(process.url + "/control", json={"mode": "ok", "reset": True})
    return fake_processes


def config(fake: Process, **extra: object) -> APIServerConfig:
    values = {
        "base_url": f"{fake.url}/v1",
        "model_name": "fake",
        "timeout": 2.0,
        "max_retries": 3,
        "retry_backoff_s": 0.05,
        "circuit_failure_threshold": 2,
        "circuit_reset_s": 0.3,
        **extra,
    }
    return APIServerConfig.model_validate(values)


def served(fake: Process) -> int:
    return int(httpx.get(fake.url + "/control").json()["served"])


@pytest.mark.parametrize("failure", ["fail", "hang", "garbage"])
async def test_a_bad_server_is_routed_around_then_comes_back(
    fakes: list[Process], failure: str
) -> None:
    bad, good = fakes
    manager = ServerManager([config(bad), config(good)])
    set_mode(bad, failure)
    try:
        answers = await asyncio.gather(
            *(manager.chat_completion(messages=CHAT, n=2) for _ in range(10))
        )
        assert all(len(a.choices) == 2 for a in answers)
        bad_server = manager.servers[0]
        assert bad_server.breaker.times_opened >= 1
        assert bad_server.failures >= 2
        assert served(good) >= 10
        set_mode(bad, "ok")
        await asyncio.sleep(0.4)
        before = served(bad)
        for _ in range(3):
            await asyncio.gather(*(manager.chat_completion(messages=CHAT) for _ in range(8)))
            await asyncio.sleep(0.05)
        assert bad_server.breaker.state is CircuitState.CLOSED
        assert served(bad) > before, "the recovered server takes requests again"
    finally:
        set_mode(bad, "ok")
        await manager.close()


async def test_every_server_down_raises_a_clear_error_then_recovers(fakes: list[Process]) -> None:
    only = fakes[0]
    manager = ServerManager([config(only, circuit_failure_threshold=10)])
    set_mode(only, "fail")
    try:
        with pytest.raises(InferenceUnavailableError, match="after 4 attempts"):
            await manager.completion(prompt="hi")
        set_mode(only, "ok")
        answer = await manager.completion(prompt="hi", n=3)
        assert [c.text for c in answer.choices] == [f" The answer is {i}" for i in range(3)]
    finally:
        await manager.close()


async def test_n_is_split_and_providers_that_ignore_n_are_asked_n_times(
    fakes: list[Process],
) -> None:
    splitting = ServerManager([config(fakes[0])], max_n_completions=8)
    ignoring = ServerManager([config(fakes[1], n_kwarg_is_ignored=True)])
    try:
        big = await splitting.chat_completion(messages=CHAT, n=20)
        assert [c.index for c in big.choices] == list(range(20))
        assert httpx.get(fakes[0].url + "/control").json()["requests"] == 3
        small = await ignoring.chat_completion(messages=CHAT, n=4)
        assert len(small.choices) == 4
        assert httpx.get(fakes[1].url + "/control").json()["requests"] == 4
    finally:
        await splitting.close()
        await ignoring.close()


async def test_least_loaded_routing_spreads_requests(fakes: list[Process]) -> None:
    manager = ServerManager([config(f, num_max_requests_at_once=4) for f in fakes])
    try:
        await asyncio.gather(*(manager.completion(prompt="x") for _ in range(40)))
        counts = [served(f) for f in fakes]
        assert sum(counts) == 40 and min(counts) >= 10, counts
    finally:
        await manager.close()


async def test_eval_requests_use_their_own_capacity(fakes: list[Process]) -> None:
    manager = ServerManager([config(fakes[0], num_max_requests_at_once=1, num_requests_for_eval=3)])
    server = manager.servers[0]
    assert server.capacity("train") == 1 and server.capacity("eval") == 3
    await manager.update_weight(0.25)
    assert server.capacity("train") == 1, "never below one slot"
    try:
        answer = await manager.chat_completion(messages=CHAT, split="eval")
        assert answer.choices[0].message.content == "The answer is 0"
        assert len(server.latencies["eval"]) == 1 and not server.latencies["train"]
    finally:
        await manager.close()


def test_a_single_server_config_is_one_server_at_its_base_url() -> None:
    manager = ServerManager(APIServerConfig(base_url="http://10.1.2.3:8123/v1"))
    assert [s.base_url for s in manager.servers] == ["http://10.1.2.3:8123/v1"]


async def test_a_refused_request_is_not_retried_and_keeps_the_server_in_rotation(
    fakes: list[Process],
) -> None:
    manager = ServerManager([config(fakes[0])])
    set_mode(fakes[0], "reject")
    try:
        with pytest.raises(InferenceRejectedError, match="not served here"):
            await manager.chat_completion(messages=CHAT)
        assert httpx.get(fakes[0].url + "/control").json()["requests"] == 1
        assert manager.servers[0].breaker.state is CircuitState.CLOSED
    finally:
        await manager.close()
