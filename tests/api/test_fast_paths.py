"""Each fast path answers exactly what its plain path answers, on seeded random inputs.

- the per-group routes served straight from ASGI (``HotRoutes``) against the same routes
  through the whole FastAPI stack (what a CORS setup gets);
- a batch in msgpack with packed arrays against the same batch in JSON, as a trainer reads it.

(simdjson group decoding against orjson, and the bitset packing against brute-force subset
sums, have their own property tests in test_fastjson.py and test_batch_formation.py.)
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from broker_testlib import trainer_body

from atroposlib import codec
from atroposlib.api.app import create_app
from atroposlib.api.settings import BrokerSettings
from atroposlib.wire.common import MSGPACK_CONTENT_TYPE


@asynccontextmanager
async def broker(*, hot: bool) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(BrokerSettings(store="memory"))
    if not hot:
        app.hot_routes = None  # every request goes through FastAPI's routing and middleware
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            yield client


def random_group(rng: random.Random) -> dict[str, Any]:
    size = rng.randint(1, 4)
    lengths = [rng.randint(1, 12) for _ in range(size)]
    tokens = [[rng.randint(0, 2**31 - 1) for _ in range(n)] for n in lengths]
    group: dict[str, Any] = {
        "tokens": tokens,
        "masks": [[rng.choice([-100, t]) for t in row] for row in tokens],
        "scores": [rng.uniform(-1, 1) for _ in range(size)],
    }
    if rng.random() < 0.3:
        group["advantages"] = [[rng.uniform(-3, 3) for _ in range(n)] for n in lengths]
    if rng.random() < 0.3:
        group["group_id"] = f"g{rng.randint(0, 5)}"  # repeats: duplicates are answered too
    if rng.random() < 0.2:
        group["messages"] = [[{"role": "user", "content": "hé"}]] * size
    return group


def broken(rng: random.Random, group: dict[str, Any]) -> dict[str, Any]:
    """A group that breaks the contract in one of several ways."""
    kind = rng.randrange(4)
    if kind == 0:
        return {k: v for k, v in group.items() if k != "scores"}
    if kind == 1:
        return {**group, "tokens": [["x"] * len(row) for row in group["tokens"]]}
    if kind == 2:
        return {**group, "masks": group["masks"][:-1] or [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]}
    return {**group, "env_id": 99}


def requests(rng: random.Random) -> list[tuple[str, str, dict[str, str], bytes]]:
    calls: list[tuple[str, str, dict[str, str], bytes]] = []
    for _ in range(12):
        group = random_group(rng)
        roll = rng.random()
        if roll < 0.45:
            calls.append(("POST", "/scored_data", {}, orjson.dumps(group)))
        elif roll < 0.6:
            body = codec.encode(codec.pack_group(group), MSGPACK_CONTENT_TYPE)[0]
            calls.append(("POST", "/scored_data", {"content-type": MSGPACK_CONTENT_TYPE}, body))
        elif roll < 0.75:
            groups = [group, random_group(rng)]
            calls.append(("POST", "/scored_data_list", {}, orjson.dumps(groups)))
        elif roll < 0.85:
            calls.append(("POST", "/scored_data", {}, orjson.dumps(broken(rng, group))))
        else:
            accept = rng.choice(["application/json", MSGPACK_CONTENT_TYPE])
            calls.append(("GET", "/batch", {"accept": accept}, b""))
    calls.append(("GET", "/batch?received=x", {}, b""))
    return calls


async def answers(hot: bool, calls: list[tuple[str, str, dict[str, str], bytes]]) -> list[Any]:
    out: list[Any] = []
    async with broker(hot=hot) as client:
        await client.post("/register", json=trainer_body(batch_size=4, max_token_len=64))
        for method, path, headers, body in calls:
            answer = await client.request(method, path, headers=headers, content=body)
            media = answer.headers["content-type"]
            out.append((answer.status_code, media, codec.decode(answer.content, media)))
    return out


@pytest.mark.parametrize("seed", range(8))
async def test_hot_routes_answer_what_the_fastapi_routes_answer(seed: int) -> None:
    calls = requests(random.Random(seed))
    fast, plain = await answers(True, calls), await answers(False, calls)
    assert fast == plain
    statuses = {status for status, _, _ in fast}
    assert 200 in statuses and statuses & {404, 422}  # both kinds of answer were compared


@pytest.mark.parametrize("seed", range(4))
async def test_a_msgpack_batch_is_the_json_batch(seed: int) -> None:
    rng = random.Random(seed)
    groups = [random_group(rng) for _ in range(8)]
    pulled: dict[str, list[dict[str, Any]]] = {}
    for accept in ("application/json", MSGPACK_CONTENT_TYPE):
        async with broker(hot=True) as client:
            await client.post("/register", json=trainer_body(batch_size=4, max_token_len=64))
            for group in groups:
                group = {k: v for k, v in group.items() if k != "group_id"}
                assert (await client.post("/scored_data", json=group)).status_code == 200
            got: list[dict[str, Any]] = []
            while True:
                answer = await client.get("/batch", headers={"accept": accept})
                batch = codec.decode(answer.content, answer.headers["content-type"])["batch"]
                if batch is None:
                    break
                got.extend(codec.unpack_group(group) for group in batch)
            pulled[accept] = got
    as_json, as_msgpack = pulled["application/json"], pulled[MSGPACK_CONTENT_TYPE]
    assert len(as_json) == len(as_msgpack) > 0
    for plain, packed in zip(as_json, as_msgpack, strict=True):
        assert plain.keys() == packed.keys()
        for key, value in plain.items():
            if isinstance(value, list) and value and isinstance(value[0], np.ndarray):
                assert [row.dtype for row in value] == [row.dtype for row in packed[key]]
                assert all(np.array_equal(a, b) for a, b in zip(value, packed[key], strict=True))
            else:
                assert value == packed[key], key
