"""The simdjson decoding of JSON groups: the same groups as the ordinary path, or a fallback."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
import pytest
from broker_testlib import in_process, make_group, trainer_body
from hypothesis import given, settings
from hypothesis import strategies as st

from atroposlib.api.fastjson import decode_groups
from atroposlib.api.settings import BrokerSettings
from atroposlib.api.validation import check_group

INT32 = st.integers(-(2**31), 2**31 - 1)


@st.composite
def groups(draw: st.DrawFn) -> dict[str, Any]:
    size = draw(st.integers(1, 4))
    lengths = [draw(st.integers(0, 6)) for _ in range(size)]
    group: dict[str, Any] = {
        "tokens": [draw(st.lists(INT32, min_size=n, max_size=n)) for n in lengths],
        "masks": [draw(st.lists(INT32, min_size=n, max_size=n)) for n in lengths],
        "scores": [draw(st.floats(-5, 5)) for _ in range(size)],
        "env_id": draw(st.none() | st.integers(0, 3)),
        "group_id": draw(st.none() | st.text(max_size=8)),
        "messages": draw(st.none() | st.just([[{"role": "user", "content": "hé"}]] * size)),
    }
    if draw(st.booleans()):
        floats = st.floats(-1e6, 1e6) | st.integers(-5, 5)
        group["advantages"] = [draw(st.lists(floats, min_size=n, max_size=n)) for n in lengths]
    return group


def _same(fast: dict[str, Any], slow: dict[str, Any]) -> None:
    assert fast.keys() == slow.keys()
    for key, value in slow.items():
        if isinstance(value, list) and value and isinstance(value[0], np.ndarray):
            assert [row.dtype for row in fast[key]] == [row.dtype for row in value]
            assert all(np.array_equal(a, b) for a, b in zip(fast[key], value, strict=True))
        else:
            assert fast[key] == value


@settings(max_examples=150, deadline=None)
@given(groups())
def test_fast_decoding_validates_to_the_same_group_as_orjson(group: dict[str, Any]) -> None:
    body = orjson.dumps(group)
    fast = decode_groups(body)
    assert isinstance(fast, dict)
    assert all(row.dtype == np.int32 for row in fast["tokens"] + fast["masks"])
    checked_fast = check_group(fast)
    checked_slow = check_group(orjson.loads(body))
    _same(checked_fast.group, checked_slow.group)
    assert (checked_fast.tokens, checked_fast.max_len) == (
        checked_slow.tokens,
        checked_slow.max_len,
    )


def test_list_bodies_decode_group_by_group() -> None:
    body = orjson.dumps([make_group(marker=5), make_group(size=1, marker=9, env_id=0)])
    decoded = decode_groups(body)
    assert isinstance(decoded, list) and len(decoded) == 2
    assert [int(row[0]) for g in decoded for row in g["tokens"]] == [5, 6, 9]


@pytest.mark.parametrize(
    "body",
    [
        b'{"tokens": [[1, 5.0]]}',  # integral floats: the protocol takes them, the slow path knows
        b'{"tokens": [[1, true]]}',
        b'{"tokens": [[1, 2147483648]]}',  # past int32: the slow path names it
        b'{"tokens": [[1], [], [-2147483649]]}',  # in a later row
        b'{"tokens": [[1, 99999999999999999999]]}',  # past 64 bits
        b'{"tokens": [[1, "2"]]}',
        b'{"tokens": [1, 2]}',
        b'{"masks": 7}',
        b'{"scores": [NaN]}',  # Python clients' NaN literal: decoded by json, named by validation
        b"[1, 2]",
        b"42",
        b"not json",
        b"",
        b'{"a\\u0000": 1, "tokens": [[1]]}',  # a key simdjson cannot look up (found by fuzzing)
    ],
)
def test_anything_unusual_falls_back_to_the_ordinary_path(body: bytes) -> None:
    assert decode_groups(body) is None


def test_parser_recovers_when_a_previous_document_is_still_referenced() -> None:
    import simdjson

    from atroposlib.api import fastjson

    held = fastjson._decoder.parse(b'{"tokens": [[1]]}')  # keeps the parser's document alive
    assert isinstance(held, simdjson.Object)
    again = decode_groups(orjson.dumps(make_group(marker=3)))
    assert again is not None and int(again["tokens"][0][0]) == 3
    del held


@pytest.mark.parametrize("cors", [False, True])
async def test_json_posts_round_trip_on_both_route_paths(cors: bool) -> None:
    """The direct ASGI routes (no CORS) and the FastAPI ones (CORS) accept and answer alike."""
    origins = ["https://ok.example"] if cors else []
    settings_ = BrokerSettings(store="memory", cors_origins=origins)
    async with in_process(settings_) as client:
        assert (await client.post("/register", json=trainer_body(batch_size=4))).status_code == 200
        await client.get("/batch")
        odd = make_group(marker=100)
        odd["tokens"][1] = [101.0, 7.0, 7.0, 7.0]  # integral floats: accepted through the fallback
        content = json.dumps(odd).encode()
        headers = {"Content-Type": "application/json"}
        if cors:
            headers["Origin"] = "https://ok.example"
        posted = await client.post("/scored_data", content=content, headers=headers)
        assert posted.json() == {"status": "received", "duplicate": False}
        assert ("access-control-allow-origin" in posted.headers) is cors
        listed = await client.post("/scored_data_list", json=[make_group(marker=200)])
        assert listed.json()["groups_processed"] == 1
        bad = await client.post("/scored_data", json={**make_group(), "scores": [1.0]})
        assert bad.status_code == 422 and bad.json()["detail"].startswith("scores")
        batch = (await client.get("/batch")).json()
        assert batch["step"] == 1
        assert [row for g in batch["batch"] for row in g["tokens"]] == [
            [100, 7, 7, 7], [101, 7, 7, 7], [200, 7, 7, 7], [201, 7, 7, 7],
        ]  # fmt: skip


async def test_a_key_with_an_escaped_nul_is_answered_never_a_500() -> None:
    async with in_process() as client:
        await client.post("/register", json=trainer_body(batch_size=2, max_token_len=32))
        body = b'{"\\u0000~": 1, "tokens": [[1, 2]], "masks": [[1, 2]], "scores": [1.0]}'
        answer = await client.post(
            "/scored_data", content=body, headers={"content-type": "application/json"}
        )
        assert answer.status_code in (200, 422), answer.text
