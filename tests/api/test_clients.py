"""EnvClient in process (retries, rejections, group ids) and both clients on a real broker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import numpy as np
import pytest
from broker_testlib import BrokerProcess, env_body, make_group, markers, trainer_body

from atroposlib.api.app import create_app
from atroposlib.api.settings import BrokerSettings
from atroposlib.client import EnvClient, TrainerClient
from atroposlib.errors import BrokerRejectedError, BrokerUnavailableError
from atroposlib.wire.broker import EnvRegistration, ScoredData, TrainerRegistration
from tests.fakes import free_port


async def test_env_client_waits_out_503_and_dedups_its_retries() -> None:
    settings = BrokerSettings(store="memory", max_queued_groups=2, retry_after_seconds=1)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        )
        env = EnvClient("http://localhost", http_client=http, encoding="json", max_retries=3)
        assert (await env.post_groups([make_group(), make_group()])).groups_processed == 2
        drained = asyncio.create_task(env.post_groups([make_group(marker=5)]))
        await asyncio.sleep(0.3)
        assert not drained.done()
        await http.get("/reset_data")
        assert (await drained).groups_processed == 1
        with pytest.raises(BrokerRejectedError) as rejected:
            await env.post_groups([make_group(), {"tokens": [[1]], "masks": [[1]], "scores": []}])
        assert rejected.value.status_code == 422 and "[1].scores" in str(rejected.value.detail)
        status = (await http.get("/status")).json()
        assert status["queue_size"] == 1
        await env.aclose()
        await http.aclose()


async def test_env_client_gives_up_when_broker_is_unreachable() -> None:
    env = EnvClient(f"http://127.0.0.1:{free_port()}", max_retries=2, backoff=0.01)
    with pytest.raises(BrokerUnavailableError):
        await env.post_groups([make_group()])
    await env.aclose()


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
async def test_trainer_and_env_clients_on_a_real_broker(
    broker_process: Callable[..., BrokerProcess], encoding: str
) -> None:
    broker = broker_process(api_key="k")
    trainer = TrainerClient(broker.url, api_key="k", encoding=encoding)  # type: ignore[arg-type]
    env = EnvClient(broker.url, api_key="k", encoding=encoding)  # type: ignore[arg-type]
    trainer.register(TrainerRegistration.model_validate(trainer_body(batch_size=4)))
    registering = asyncio.create_task(
        env.register_env(EnvRegistration.model_validate(env_body()), wait_timeout=20)
    )
    await asyncio.sleep(0.2)
    assert trainer.get_batch() is None
    registered = await registering
    assert registered.wandb_name == "gsm8k_0"
    assert (await env.info()).batch_size == 4
    assert (await env.wandb_info()).project == "project"
    numpy_group = {
        "tokens": [np.array([50, 7, 7]), np.array([51, 7])],
        "masks": [np.array([-100, 7, 7]), np.array([-100, 7])],
        "scores": np.array([1.0, 0.5]),
        "inference_logprobs": [np.array([1.0, -0.5, -0.25]), np.array([1.0, -2.0])],
        "env_id": registered.env_id,
    }
    numpy_group["scores"] = numpy_group["scores"].tolist()
    model_group = ScoredData.model_validate(make_group(2, marker=60, env_id=registered.env_id))
    answer = await env.post_groups([numpy_group, model_group])
    assert answer.groups_processed == 2
    status = await env.status_env(registered.env_id)
    assert status.self_queue_size == 2
    batch = trainer.wait_for_batch(poll_interval=0.05, timeout=10)
    assert batch.step == 1
    assert markers(batch.groups) == [50, 51, 60, 61]
    first = batch.groups[0]
    assert first["tokens"][0].dtype == np.int32 and first["masks"][1].tolist() == [-100, 7]
    assert first["tokens"][0].flags.writeable
    assert first["inference_logprobs"][0].dtype == np.float32
    assert first["inference_logprobs"][1].tolist() == [1.0, -2.0]
    assert first["group_id"]
    trainer.ack(1)
    assert trainer.status().current_step == 1
    await env.disconnect_env(registered.env_id)
    with pytest.raises(BrokerRejectedError) as rejected:
        await env.status_env(99)
    assert rejected.value.status_code == 404
    with pytest.raises(TimeoutError):
        trainer.wait_for_batch(poll_interval=0.05, timeout=0.2)
    trainer.close()
    await env.aclose()
