"""Every bad input gets the right 4xx naming the field, and the queue stays as it was."""

from __future__ import annotations

import gzip
import json
from typing import Any

import httpx
import msgpack
import pytest
from broker_testlib import env_body, in_process, make_group, trainer_body
from pydantic import ValidationError

from atroposlib.api.settings import BrokerSettings
from atroposlib.api.validation import check_group
from atroposlib.errors import InvalidGroupError
from atroposlib.wire.broker import ScoredData


def _with(**fields: Any) -> dict[str, Any]:
    return {**make_group(2, length=4), **fields}


NAN = float("nan")
BAD_GROUPS: list[tuple[str, dict[str, Any] | list[Any], str]] = [
    ("missing tokens", {"masks": [[1]], "scores": [1.0]}, "tokens"),
    ("missing masks", {"tokens": [[1]], "scores": [1.0]}, "masks"),
    ("missing scores", {"tokens": [[1]], "masks": [[1]]}, "scores"),
    ("not an object", [1, 2], "body"),
    ("token not int", _with(tokens=[[1, "a", 3, 4], [1, 2, 3, 4]]), "tokens[0]"),
    ("token fraction", _with(tokens=[[1, 2.5, 3, 4], [1, 2, 3, 4]]), "tokens[0]"),
    ("masks fewer rows", _with(masks=[[-100, 7, 7, 7]]), "masks"),
    ("masks short row", _with(masks=[[-100, 7, 7, 7], [-100, 7]]), "masks[1]"),
    ("scores count", _with(scores=[1.0]), "scores"),
    ("score NaN", _with(scores=[1.0, NAN]), "scores[1]"),
    ("score inf", _with(scores=[float("inf"), 1.0]), "scores[0]"),
    ("score text", _with(scores=["high", 1.0]), "scores[0]"),
    ("advantages rows", _with(advantages=[[0.0] * 4]), "advantages"),
    ("advantages short", _with(advantages=[[0.0] * 4, [0.0] * 3]), "advantages[1]"),
    ("advantages NaN", _with(advantages=[[0.0] * 4, [0.0, NAN, 0.0, 0.0]]), "advantages[1]"),
    ("ref_logprobs short", _with(ref_logprobs=[[0.0] * 4, [0.0]]), "ref_logprobs[1]"),
    (
        "inference_logprobs",
        _with(inference_logprobs=[[0.0] * 5, [0.0] * 4]),
        "inference_logprobs[0]",
    ),
    ("overrides count", _with(overrides=[{}]), "overrides"),
    ("overrides type", _with(overrides=[{}, 3]), "overrides"),
    ("message no role", _with(messages=[[{"content": "x"}], []]), "messages[0][0]"),
    ("message not dict", _with(messages=[["hi"], []]), "messages[0][0]"),
    ("messages not chats", _with(messages=["hi"]), "messages[0]"),
    ("env_id text", _with(env_id="zero"), "env_id"),
    ("policy_version negative", _with(policy_version=-1), "policy_version"),
    ("group_id too long", _with(group_id="x" * 201), "group_id"),
    ("generation_params list", _with(generation_params=[1]), "generation_params"),
    ("empty group", {"tokens": [], "masks": [], "scores": []}, "tokens"),
    ("finish reason unknown", _with(finish_reasons=["stop", "eos"]), "finish_reasons[1]"),
    ("finish reasons count", _with(finish_reasons=["stop"]), "finish_reasons"),
    ("policy_versions text", _with(policy_versions=[1, "new"]), "policy_versions[1]"),
    ("extra not objects", _with(extra=[{}, [1]]), "extra[1]"),
    (
        "token versions short",
        _with(token_policy_versions=[[0] * 4, [0]]),
        "token_policy_versions[1]",
    ),
    ("override sft text", _with(overrides=[{}, {"sft": "yes"}]), "overrides[1].sft"),
    (
        "override temperature 0",
        _with(overrides=[{"temperature": 0}, {}]),
        "overrides[0].temperature",
    ),
    ("group_size zero", _with(group_overrides={"group_size": 0}), "group_overrides.group_size"),
    ("messages count", _with(messages=[[{"role": "user", "content": "hi"}]]), "messages"),
    ("group > batch_size", make_group(5), "tokens"),
    ("too long", make_group(1, length=33), "tokens"),
]


async def _registered(client: httpx.AsyncClient) -> None:
    await client.post("/register", json=trainer_body(batch_size=4, max_token_len=32))
    await client.get("/batch")
    await client.post("/register-env", json=env_body())
    await client.post("/scored_data", json=make_group(1, marker=1))


@pytest.mark.parametrize(("case", "body", "field"), BAD_GROUPS, ids=[c[0] for c in BAD_GROUPS])
async def test_bad_group_is_422_naming_the_field(
    client: httpx.AsyncClient, case: str, body: Any, field: str
) -> None:
    await _registered(client)
    content = json.dumps(body).encode()  # NaN literals, as Python clients send them
    answer = await client.post("/scored_data", content=content)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"].startswith(f"{field}:"), answer.json()
    listed = await client.post(
        "/scored_data_list", content=b"[" + _json(make_group()) + b"," + content + b"]"
    )
    assert listed.status_code == 422
    assert listed.json()["detail"].startswith(f"[1].{field}:"), listed.json()
    assert (await client.get("/status")).json()["queue_size"] == 1


def _json(obj: Any) -> bytes:
    return httpx.Request("POST", "/", json=obj).read()


async def test_unknown_env_is_404(client: httpx.AsyncClient) -> None:
    await _registered(client)
    answer = await client.post("/scored_data", json=make_group(env_id=9))
    assert answer.status_code == 404 and "env_id 9" in answer.json()["detail"]
    assert (await client.get("/status-env", params={"env_id": 9})).status_code == 404
    assert (await client.post("/disconnect-env", json={"env_id": 9})).status_code == 404
    assert (await client.get("/status")).json()["queue_size"] == 1


async def test_batch_and_ack_before_register_are_409(client: httpx.AsyncClient) -> None:
    answer = await client.get("/batch")
    assert answer.status_code == 409 and "/register" in answer.json()["detail"]
    assert (await client.post("/ack", json={"step": 1})).status_code == 409


async def test_bad_bodies(client: httpx.AsyncClient) -> None:
    await _registered(client)
    cases = [
        (b"not json", {}, 400, "JSON"),
        (b"plain", {"content-encoding": "gzip"}, 400, "gzip"),
        (gzip.compress(_json(make_group()))[:-6], {"content-encoding": "gzip"}, 400, "truncated"),
        (_json(make_group()), {"content-encoding": "br"}, 400, "Content-Encoding"),
        (b"\xc1", {"content-type": "application/msgpack"}, 400, "msgpack"),
        (_json({"tokens": [[1]]}), {}, 422, "masks"),
    ]
    for body, headers, status, words in cases:
        answer = await client.post("/scored_data", content=body, headers=headers)
        assert answer.status_code == status, (body[:20], answer.text)
        assert words in answer.json()["detail"]
    not_list = await client.post("/scored_data_list", json=make_group())
    assert not_list.status_code == 422 and "array" in not_list.json()["detail"]
    bad_register = await client.post("/register", json={"batch_size": 0})
    assert bad_register.status_code == 422
    assert {"batch_size", "wandb_group"} <= {e["loc"][-1] for e in bad_register.json()["detail"]}
    bad_env = await client.post("/register-env", json=env_body(weight=-1))
    assert bad_env.status_code == 422
    assert (await client.get("/status-env")).status_code == 422
    assert (await client.get("/status")).json()["queue_size"] == 1


async def test_queue_limit_answers_503_with_retry_after() -> None:
    settings = BrokerSettings(store="memory", max_queued_groups=3, retry_after_seconds=7)
    async with in_process(settings) as client:
        await client.post("/scored_data_list", json=[make_group(), make_group()])
        full = await client.post("/scored_data_list", json=[make_group(), make_group()])
        assert full.status_code == 503 and full.headers["retry-after"] == "7"
        assert "queue" in full.json()["detail"]
        assert (await client.get("/status")).json()["queue_size"] == 2
        assert (await client.post("/scored_data", json=make_group())).status_code == 200
    settings = BrokerSettings(store="memory", max_queued_bytes=400)
    async with in_process(settings) as client:
        big = await client.post("/scored_data", json=make_group(2, length=200))
        assert big.status_code == 503
        assert (await client.get("/status")).json()["queue_size"] == 0


async def test_too_long_dropped_and_counted_by_setting() -> None:
    settings = BrokerSettings(store="memory", too_long_policy="drop")
    async with in_process(settings) as client:
        await client.post("/register", json=trainer_body(max_token_len=8))
        answer = await client.post("/scored_data", json=make_group(2, length=9))
        assert answer.json()["status"] == "received"
        assert (await client.get("/status")).json()["queue_size"] == 0
        assert (
            'broker_groups_dropped_total{reason="too_long"} 1.0'
            in (await client.get("/metrics")).text
        )


VALID_AND_INVALID_FOR_BOTH: list[dict[str, Any]] = [
    make_group(),
    _with(advantages=[[0.5] * 4, [1.0] * 4], overrides=[{"sft": True}, {}]),
    _with(messages=[[{"role": "user", "content": "hi", "extra": 1}], []]),
    _with(tokens=[[1.0, 2.0, 3.0, 4.0], [1, 2, 3, 4]]),
    _with(tokens=[[True, False, True, False], [1, 2, 3, 4]]),
    _with(tokens=[[1, None, 3, 4], [1, 2, 3, 4]]),
    {"masks": [[1]], "scores": [1.0]},
    _with(tokens=[[1, "a", 3, 4], [1, 2, 3, 4]]),
    _with(tokens=[[1, 2.5, 3, 4], [1, 2, 3, 4]]),
    _with(scores=["high", 1.0]),
    _with(messages=[[{"content": "x"}], []]),
    _with(overrides=[{}, 3]),
    _with(env_id="zero"),
    _with(policy_version=-1),
    _with(group_id="x" * 201),
    _with(generation_params=[1]),
    _with(finish_reasons=["length", None], policy_versions=[3, None], extra=[{"a": [1]}, {}]),
    _with(token_policy_versions=[[-1, -1, 2, 2], [-1, -1, 3, 3]]),
    _with(overrides=[{"role": "X", "truncated": True, "mine": 1}, {"temperature": 1}]),
    _with(group_overrides={"group_size": 2, "sft": False, "anything": "kept"}),
    _with(finish_reasons=["stop", "eos"]),
    _with(finish_reasons=["stop"]),
    _with(policy_versions=[1, "new"]),
    _with(extra=[{}, [1]]),
    _with(token_policy_versions=[[0] * 4, [0]]),
    _with(overrides=[{}, {"sft": "yes"}]),
    _with(overrides=[{}, {"sft": 1}]),
    _with(overrides=[{"temperature": 0}, {}]),
    _with(overrides=[{"role": 3}, {}]),
    _with(group_overrides={"group_size": 0}),
    _with(group_overrides={"temperature": "hot"}),
    _with(messages=[[{"role": "user", "content": "hi"}]]),
    _with(messages=[]),
]


@pytest.mark.parametrize("raw", VALID_AND_INVALID_FOR_BOTH)
def test_fast_validation_agrees_with_protocol_model(raw: dict[str, Any]) -> None:
    try:
        ScoredData.model_validate(raw)
        model_ok = True
    except ValidationError:
        model_ok = False
    try:
        check_group(raw)
        fast_ok = True
    except InvalidGroupError:
        fast_ok = False
    assert fast_ok == model_ok


async def test_msgpack_values_json_cannot_carry_are_422(client: httpx.AsyncClient) -> None:
    body = msgpack.packb([make_group(), make_group(images=[b"\x89PNG"])], use_bin_type=True)
    answer = await client.post(
        "/scored_data_list", content=body, headers={"content-type": "application/msgpack"}
    )
    assert answer.status_code == 422 and answer.json()["detail"].startswith("[1].images:")
    assert (await client.get("/status")).json()["queue_size"] == 0


ODD_VALUES: list[Any] = [
    None, "x", 1, -1, 1.5, True, 2**70, [], [[]], [[1, 2]], [[1, 2, 3, 4]] * 2, {"a": 1},
    [None], [["a"]], [[True, False]], [[1e300]], [{"role": 1, "content": 2}], [[{"role": "u"}]],
    [1.0, 2.0], ["a", "b"], [[-(2**40)]], "x" * 300,
]  # fmt: skip


async def test_odd_values_never_cause_a_500_and_never_half_queue() -> None:
    import random

    rng = random.Random(0)
    fields = [*make_group(), "advantages", "ref_logprobs", "inference_logprobs", "overrides",
              "messages", "group_overrides", "env_id", "group_id", "policy_version",
              "distill_token_ids", "generation_params", "finish_reasons", "policy_versions",
              "extra", "token_policy_versions"]  # fmt: skip
    async with in_process() as client:
        await client.post("/register", json=trainer_body(batch_size=4, max_token_len=32))
        queued = 0
        for _ in range(400):
            group = make_group(2, length=4)
            for field in rng.sample(fields, rng.randint(1, 3)):
                group[field] = rng.choice(ODD_VALUES)
            answer = await client.post("/scored_data", content=json.dumps(group).encode())
            assert answer.status_code in (200, 404, 422), (group, answer.text)
            queued += answer.status_code == 200
            assert (await client.get("/status")).json()["queue_size"] == queued
        assert 0 < queued < 400
        assert (await client.get("/latest_example")).status_code == 200


@pytest.mark.parametrize(
    ("row", "ok"),
    [
        ([2**31 - 1, -(2**31), 0, 1], True),
        ([2**31, 0, 0, 0], False),
        ([-(2**31) - 1, 0, 0, 0], False),
        ([2.0**31, 0, 0, 0], False),
        ([1, 2, 3, 2**70], False),
        ([1.0, 2.0, 3.0, -4.0], True),
        ([1, 2.5, 3, 4], False),
        ([1, "2", 3, 4], False),
        ([1, None, 3, 4], False),
        ([1, [2], 3, 4], False),
        ([float("nan"), 1, 2, 3], False),
    ],
)
def test_token_rows_must_be_int32_integers(row: list[Any], ok: bool) -> None:
    for field in ("tokens", "masks"):
        raw = make_group(2, length=4)
        raw[field] = [row, raw[field][1]]
        if ok:
            checked = check_group(raw)
            assert checked.group[field][0].tolist() == [int(v) for v in row]
        else:
            with pytest.raises(InvalidGroupError) as err:
                check_group(raw)
            assert err.value.field == f"{field}[0]"


@pytest.mark.parametrize("no_messages", [{}, {"messages": None}, {"messages": []}])
async def test_no_messages_in_any_spelling_is_accepted_as_none(
    client: httpx.AsyncClient, no_messages: dict[str, Any]
) -> None:
    """Atropos 0.4's clients send ``"messages": []`` for one sequence with no chat: 200."""
    await client.post("/register", json=trainer_body(batch_size=1, max_token_len=32))
    group = {"tokens": [[1, 2, 3]], "masks": [[1, 1, 1]], "scores": [1.0], **no_messages}
    answer = await client.post("/scored_data", json=group)
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "received"
    batch = (await client.get("/batch")).json()["batch"]
    assert batch is not None and batch[0]["messages"] is None
