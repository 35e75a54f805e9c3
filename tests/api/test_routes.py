"""Every Atropos endpoint answers with Atropos's shapes; our additions are additive."""

from __future__ import annotations

import gzip

import httpx
import msgpack
import numpy as np
import pytest
from broker_testlib import env_body, in_process, make_group, markers, trainer_body

from atroposlib.api.settings import BrokerSettings
from atroposlib.codec import pack_group


async def start_trainer(client: httpx.AsyncClient, **overrides: object) -> None:
    assert (await client.post("/register", json=trainer_body(**overrides))).status_code == 200
    assert (await client.get("/batch")).json()["batch"] is None


async def test_root_info_and_wandb_before_registration(client: httpx.AsyncClient) -> None:
    assert "message" in (await client.get("/")).json()
    assert (await client.get("/info")).json() == {"batch_size": -1, "max_token_len": -1}
    assert (await client.get("/wandb_info")).json() == {"group": None, "project": None}
    assert (await client.get("/status")).json() == {"current_step": 0, "queue_size": 0}


async def test_register_answers_integer_uuid(client: httpx.AsyncClient) -> None:
    answer = (await client.post("/register", json=trainer_body())).json()
    assert set(answer) == {"uuid"} and isinstance(answer["uuid"], int)
    assert (await client.get("/info")).json() == {"batch_size": 4, "max_token_len": 32}
    assert (await client.get("/wandb_info")).json() == {"group": "group", "project": "project"}


async def test_register_env_waits_for_first_batch_then_names_envs(
    client: httpx.AsyncClient,
) -> None:
    await client.post("/register", json=trainer_body(starting_step=5))
    waiting = await client.post("/register-env", json=env_body())
    assert waiting.json() == {"status": "wait for trainer to start"}
    await client.get("/batch")
    names = []
    for name in ("gsm8k", "gsm8k", "math", "gsm8k"):
        answer = (await client.post("/register-env", json=env_body(desired_name=name))).json()
        names.append((answer["env_id"], answer["wandb_name"]))
    assert names == [(0, "gsm8k_0"), (1, "gsm8k_1"), (2, "math_0"), (3, "gsm8k_2")]
    assert answer == {
        "status": "success",
        "env_id": 3,
        "wandb_name": "gsm8k_2",
        "checkpoint_dir": "ckpt",
        "starting_step": 5,
        "checkpoint_interval": 10,
        "num_steps": 100,
    }
    assert (await client.post("/disconnect-env", json={"env_id": 1})).json() == {
        "status": "success"
    }
    assert (await client.post("/register-env", json=env_body())).json()["env_id"] == 4


async def test_full_batch_has_every_key_and_exact_size(client: httpx.AsyncClient) -> None:
    await start_trainer(client)
    await client.post("/register-env", json=env_body())
    sent = [make_group(2, marker=100, env_id=0), make_group(1, marker=200), make_group(1)]
    for group in sent:
        assert (await client.post("/scored_data", json=group)).json() == {
            "status": "received",
            "duplicate": False,
        }
    assert (await client.get("/status")).json() == {"current_step": 0, "queue_size": 3}
    answer = (await client.get("/batch")).json()
    assert answer["step"] == 1
    assert sum(len(g["tokens"]) for g in answer["batch"]) == 4
    assert markers(answer["batch"]) == [100, 101, 200, 1000]
    first = answer["batch"][0]
    assert set(first) >= {"tokens", "masks", "scores", "advantages", "messages", "env_id"}
    assert first["masks"] == sent[0]["masks"] and first["scores"] == [0.0, 1.0]
    assert (await client.get("/status")).json() == {"current_step": 1, "queue_size": 0}
    assert (await client.get("/batch")).json() == {"batch": None, "step": None}


async def test_scored_data_list_and_latest_example(client: httpx.AsyncClient) -> None:
    empty = (await client.get("/latest_example")).json()
    assert empty["tokens"] == [] and empty["scores"] == []
    groups = [
        make_group(marker=10),
        make_group(marker=20, messages=[[{"role": "u", "content": "x"}]] * 2),
    ]
    answer = (await client.post("/scored_data_list", json=groups)).json()
    assert answer == {"status": "received", "groups_processed": 2, "duplicates": 0}
    latest = (await client.get("/latest_example")).json()
    assert latest["tokens"][0][0] == 20 and latest["messages"][0][0]["role"] == "u"


async def test_group_id_deduplicates(client: httpx.AsyncClient) -> None:
    group = make_group(group_id="abc")
    assert (await client.post("/scored_data", json=group)).json()["duplicate"] is False
    assert (await client.post("/scored_data", json=group)).json()["duplicate"] is True
    answer = await client.post("/scored_data_list", json=[group, make_group(group_id="d")] * 2)
    assert answer.json()["duplicates"] == 3
    assert (await client.get("/status")).json()["queue_size"] == 2


async def test_status_env_numbers_for_a_known_queue(client: httpx.AsyncClient) -> None:
    await start_trainer(client, batch_size=8)
    await client.post(
        "/register-env", json=env_body(max_token_length=100, weight=1.0, group_size=2)
    )
    await client.post(
        "/register-env",
        json=env_body(max_token_length=300, weight=1.0, group_size=4, min_batch_allocation=0.5),
    )
    for _ in range(3):
        await client.post("/scored_data", json=make_group(2, env_id=0))
    for _ in range(2):
        await client.post("/scored_data", json=make_group(4, env_id=1))
    by_body = (await client.request("GET", "/status-env", json={"env_id": 0})).json()
    by_query = (await client.get("/status-env", params={"env_id": 0})).json()
    assert (
        by_body
        == by_query
        == {
            "current_step": 0,
            "queue_size": (6 + (8 - 4)) // 2,
            "unallocated_fraction": 0.5,
            "self_queue_size": 3,
            "max_group_size": 4,
            "env_weight": 0.25,
        }
    )
    other = (await client.get("/status-env", params={"env_id": 1})).json()
    assert other["queue_size"] == (8 + 6) // 4 and other["self_queue_size"] == 2
    assert other["env_weight"] == 0.75


async def test_reset_data_clears_everything(client: httpx.AsyncClient) -> None:
    await start_trainer(client)
    await client.post("/scored_data", json=make_group(group_id="x"))
    reset = await client.get("/reset_data")
    assert reset.text == "Reset successful"
    assert (await client.get("/status")).json() == {"current_step": 0, "queue_size": 0}
    assert (await client.get("/info")).json()["batch_size"] == -1
    assert (await client.post("/scored_data", json=make_group(group_id="x"))).json()[
        "duplicate"
    ] is False


async def test_recent_groups_is_read_only(client: httpx.AsyncClient) -> None:
    await start_trainer(client, batch_size=2)
    for marker in (1, 2, 3):
        await client.post("/scored_data", json=make_group(1, marker=marker))
    for _ in range(2):
        recent = (await client.get("/recent_groups", params={"limit": 2})).json()["groups"]
        assert markers(recent) == [2, 3]
    assert (await client.get("/status")).json()["queue_size"] == 3
    assert markers((await client.get("/batch")).json()["batch"]) == [1, 2]


async def test_msgpack_in_and_out(client: httpx.AsyncClient) -> None:
    await start_trainer(client, batch_size=2)
    group = make_group(2, marker=5, inference_logprobs=[[1.0, -0.5, -0.25, -1.0]] * 2)
    body = msgpack.packb([pack_group(group)], use_bin_type=True)
    headers = {"content-type": "application/msgpack", "accept": "application/msgpack"}
    answer = await client.post("/scored_data_list", content=body, headers=headers)
    assert msgpack.unpackb(answer.content)["groups_processed"] == 1
    batch = msgpack.unpackb((await client.get("/batch", headers=headers)).content)
    rows = batch["batch"][0]["tokens"]
    assert isinstance(rows[0], bytes)
    assert np.frombuffer(rows[1], "<i4").tolist() == group["tokens"][1]
    logprobs = np.frombuffer(batch["batch"][0]["inference_logprobs"][0], "<f4")
    assert logprobs.tolist() == [1.0, -0.5, -0.25, -1.0]


async def test_gzip_request_and_response(client: httpx.AsyncClient) -> None:
    await start_trainer(client, batch_size=4)
    groups = [make_group(2, length=30), make_group(2, length=30)]
    body = gzip.compress(httpx.Request("POST", "/", json=groups).read())
    answer = await client.post(
        "/scored_data_list", content=body, headers={"content-encoding": "gzip"}
    )
    assert answer.json()["groups_processed"] == 2
    batch = await client.get("/batch", headers={"accept-encoding": "gzip"})
    assert batch.headers["content-encoding"] == "gzip"
    assert len(batch.json()["batch"]) == 2


async def test_auth_required_when_api_key_set() -> None:
    settings = BrokerSettings(store="memory", api_key="s3cret")
    async with in_process(settings) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            answer = await client.get("/status", headers=headers)
            assert answer.status_code == 401 and "bearer" in answer.json()["detail"]
            assert (await client.get("/openapi.json", headers=headers)).status_code == 401
            posted = await client.post("/scored_data", json=make_group(), headers=headers)
            assert posted.status_code == 401
        ok = await client.get("/status", headers={"Authorization": "Bearer s3cret"})
        assert ok.json()["queue_size"] == 0


async def test_cors_only_for_configured_origins() -> None:
    settings = BrokerSettings(store="memory", cors_origins=["https://ok.example"])
    async with in_process(settings) as client:
        good = await client.get("/status", headers={"Origin": "https://ok.example"})
        assert good.headers["access-control-allow-origin"] == "https://ok.example"
        bad = await client.get("/status", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in bad.headers
    async with in_process() as client:
        answer = await client.get("/status", headers={"Origin": "https://ok.example"})
        assert "access-control-allow-origin" not in answer.headers


async def test_health_and_metrics(client: httpx.AsyncClient) -> None:
    health = (await client.get("/health")).json()
    assert health["status"] == "ok" and health["queue_size"] == 0
    await client.post("/scored_data", json=make_group(3))
    text = (await client.get("/metrics")).text
    assert 'broker_queue_groups{env_id="none"} 1.0' in text
    assert "broker_groups_in_total 1.0" in text
    assert "broker_request_bytes_total" in text


async def test_stale_groups_dropped_and_counted_in_metrics(client: httpx.AsyncClient) -> None:
    await start_trainer(client, batch_size=1, max_staleness=2, starting_step=5)
    await client.post("/scored_data", json=make_group(1, marker=1, policy_version=2))
    await client.post("/scored_data", json=make_group(1, marker=2, policy_version=3))
    answer = (await client.get("/batch")).json()
    assert answer["step"] == 6 and markers(answer["batch"]) == [2]
    text = (await client.get("/metrics")).text
    assert 'broker_groups_dropped_total{reason="stale"} 1.0' in text
    assert "broker_groups_out_total 1.0" in text


async def test_stale_policy_reject_answers_422_naming_the_field() -> None:
    async with in_process(BrokerSettings(store="memory", stale_policy="reject")) as client:
        await start_trainer(client, batch_size=1, max_staleness=2, starting_step=5)
        old = make_group(1, marker=1, token_policy_versions=[[-1, 2, 4, 4]])
        answer = await client.post("/scored_data", json=old)
        assert answer.status_code == 422
        assert "policy_versions" in answer.text and "max_staleness 2" in answer.text
        fresh = make_group(1, marker=2, token_policy_versions=[[-1, 3, 4, 4]])
        assert (await client.post("/scored_data", json=fresh)).status_code == 200
        assert markers((await client.get("/batch")).json()["batch"]) == [2]


async def test_reregistered_trainer_gets_the_same_batches_again(client: httpx.AsyncClient) -> None:
    await start_trainer(client, batch_size=2, acknowledges=True)
    for marker in range(10, 18, 2):
        await client.post("/scored_data", json=make_group(2, marker=marker))
    first = [(await client.get("/batch")).json() for _ in range(3)]
    assert [b["step"] for b in first] == [1, 2, 3]
    assert (await client.post("/ack", json={"step": 1})).json() == {
        "status": "success",
        "acknowledged_step": 1,
    }
    await client.post("/register", json=trainer_body(batch_size=2, starting_step=1))
    again = [(await client.get("/batch")).json() for _ in range(2)]
    assert again == first[1:]
    fresh = (await client.get("/batch")).json()
    assert fresh["step"] == 4 and markers(fresh["batch"]) == [16, 17]


@pytest.mark.parametrize(
    ("fields", "without_key", "with_key"),
    [
        ({}, 404, 404),
        ({"api_key": "s3cret"}, 401, 404),
        ({"expose_api_docs": True}, 200, 200),
        ({"expose_api_docs": True, "api_key": "s3cret"}, 401, 200),
    ],
)
async def test_the_schema_routes_are_off_unless_exposed_then_behind_the_key(
    fields: dict[str, object], without_key: int, with_key: int
) -> None:
    settings = BrokerSettings(store="memory", **fields)  # type: ignore[arg-type]
    key = {"Authorization": "Bearer s3cret"}
    async with in_process(settings) as client:
        for path in ("/openapi.json", "/docs", "/redoc"):
            assert (await client.get(path)).status_code == without_key, path
            assert (await client.get(path, headers=key)).status_code == with_key, path
        assert (await client.get("/status", headers=key)).json()["queue_size"] == 0


async def test_with_a_key_and_cors_preflights_pass_and_refusals_carry_cors_headers() -> None:
    settings = BrokerSettings(store="memory", api_key="s3cret", cors_origins=["https://ok.example"])
    origin = {"origin": "https://ok.example"}
    async with in_process(settings) as client:
        preflight = await client.options(
            "/scored_data", headers=origin | {"access-control-request-method": "POST",
                                              "access-control-request-headers": "authorization"},
        )  # fmt: skip
        assert preflight.status_code == 200  # a browser's preflight carries no key
        refused = await client.post("/scored_data", json=make_group(), headers=origin)
        assert refused.status_code == 401
        assert refused.headers["access-control-allow-origin"] == "https://ok.example"
        key = {"Authorization": "Bearer s3cret"}
        assert (await client.get("/status", headers=key)).json()["queue_size"] == 0
