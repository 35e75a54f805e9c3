"""The embedded engine's side of the weight-path rules, against a recording fleet (no server):
each server gets a block named with the prefix it announced and its own update token on every
call of the update; servers that announced different prefixes get one block each."""

from __future__ import annotations

import os
from collections.abc import Callable
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import torch

from atroposlib.wire.engine import UPDATE_TOKEN_HEADER
from example_trainer.inflight.embedded import EmbeddedEngine
from example_trainer.inflight.tensors import PushedWeights

WEIGHTS = {"a": torch.arange(6.0), "b": torch.ones(4)}


class RecordingFleet:
    """Answers as two embedded servers would; records each call with what the block held."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def each(self, call: Callable[[str], Any]) -> dict[str, Any]:
        return {url: call(url) for url in self.urls}

    def request(self, method: str, url: str, path: str, **kwargs: Any) -> Any:
        info = (kwargs.get("json") or {}).get("update_info")
        if info is not None:  # what the server would find when it opens the block
            block = shared_memory.SharedMemory(name=info["shm_name"])
            kwargs["found"] = (os.fstat(block._fd).st_mode & 0o777, block.size)  # type: ignore[attr-defined]
            block.close()
        self.calls.append((url, path, kwargs))
        if path == "/init_weight_transfer_engine":
            return {"dtype": "float32", "shm_prefix": f"atropos_{url}_"}
        if path == "/start_weight_update":
            return {"update_token": f"token-{url}"}
        return {}


def test_each_server_gets_its_own_prefix_and_token() -> None:
    fleet = RecordingFleet(["s1", "s2"])
    engine = EmbeddedEngine(transport="shm")
    pushed = PushedWeights(lambda: iter(WEIGHTS.items()), lambda: Path("unused"))
    engine.connect(fleet)  # type: ignore[arg-type]
    engine.send(fleet, pushed, "1")  # type: ignore[arg-type]
    engine.finish(fleet, "1")  # type: ignore[arg-type]
    updates = [(url, kw) for url, path, kw in fleet.calls if path == "/update_weights"]
    assert sorted(url for url, _ in updates) == ["s1", "s2"]
    for url, kwargs in updates:
        info = kwargs["json"]["update_info"]
        assert info["shm_name"].startswith(f"atropos_{url}_")
        assert kwargs["found"] == (0o600, info["shm_bytes"])
        assert kwargs["headers"] == {UPDATE_TOKEN_HEADER: f"token-{url}"}
    finishes = {url: kw["headers"] for url, path, kw in fleet.calls if "finish" in path}
    assert finishes == {u: {UPDATE_TOKEN_HEADER: f"token-{u}"} for u in ("s1", "s2")}
    names = [kw["json"]["update_info"]["shm_name"] for _, kw in updates]
    engine.close()
    for name in names:  # released with the engine
        assert not Path("/dev/shm", name).exists()
