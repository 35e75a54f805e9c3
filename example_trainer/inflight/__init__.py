"""Weights that reach inference servers while they generate: the engines' native APIs.

:class:`~example_trainer.inflight.driver.LiveSync` drives one push the same way for every
engine; :mod:`.embedded`, :mod:`.vllm` and :mod:`.sglang` speak each engine's routes.
"""

from __future__ import annotations

from typing import Literal

import torch

from example_trainer.config import LIVE_SYNC
from example_trainer.inflight.driver import LiveEngine, LiveSync, PauseMode
from example_trainer.inflight.embedded import EmbeddedEngine
from example_trainer.inflight.fleet import Fleet
from example_trainer.inflight.sglang import SglangEngine
from example_trainer.inflight.vllm import VllmEngine

Engine = Literal["embedded", "vllm", "sglang"]


def make_live_sync(
    engine: Engine,
    fleet: Fleet,
    *,
    transport: str = "auto",
    pause: PauseMode = "keep",
    chunk_bytes: int = 32 << 20,
    verify: Literal["version", "checksum"] = "version",
    recompute_kv: bool = False,
    retries: int = 3,
    master_address: str = "127.0.0.1",
    master_port: int = 29600,
    dtype: torch.dtype | None = None,
) -> LiveSync:
    chosen = LIVE_SYNC[engine][0] if transport == "auto" else transport
    if chosen not in LIVE_SYNC[engine]:
        raise ValueError(f"weight_sync={engine} has no transport {chosen!r}: {LIVE_SYNC[engine]}")
    where = {"master_address": master_address, "master_port": master_port}
    live: LiveEngine
    if engine == "embedded":
        live = EmbeddedEngine(chosen, chunk_bytes, checksum=verify == "checksum")  # type: ignore[arg-type]
    elif engine == "vllm":
        live = VllmEngine(chosen, chunk_bytes=chunk_bytes, dtype=dtype, **where)  # type: ignore[arg-type]
    else:
        live = SglangEngine(
            chosen,
            chunk_bytes=chunk_bytes,
            dtype=dtype,
            recompute_kv=recompute_kv,
            **where,  # type: ignore[arg-type]
        )
    return LiveSync(
        live, fleet, pause=pause, retries=retries, verify=verify, recompute_kv=recompute_kv
    )


__all__ = ["Fleet", "LiveSync", "make_live_sync"]
