"""The embedded server's control API (vLLM's routes), with chunks over HTTP or shared memory.

``http``: each chunk is a safetensors file POSTed to every server. ``shm``: each chunk is
written once into a POSIX shared-memory block (one block, reused) that every server (on this
machine) copies out of before it answers. Tensors are sent in the served dtype
(``/init_weight_transfer_engine`` says which), so their checksums can be compared with the
servers' exactly. The server stages the chunks beside the weights it serves, so they travel
before the pause, which covers only the swap.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
from safetensors.torch import save as safetensors_bytes

from atroposlib.inference.weight_transfer import DTYPES, checksums
from example_trainer.inflight.driver import VllmRoutes
from example_trainer.inflight.fleet import Fleet, SyncFailure
from example_trainer.inflight.shm import SharedBlock
from example_trainer.inflight.tensors import PushedWeights, chunks

logger = logging.getLogger(__name__)

Transport = Literal["http", "shm"]


class EmbeddedEngine(VllmRoutes):
    """``weight_sync: embedded``: atroposlib's inference server, weights in flight on CPU."""

    stages_before_pause = True

    def __init__(
        self, transport: Transport = "http", chunk_bytes: int = 32 << 20, checksum: bool = False
    ) -> None:
        self.transport, self.chunk_bytes, self.checksum = transport, chunk_bytes, checksum
        self.dtype: torch.dtype = torch.float32
        self._sent: dict[str, str] = {}
        self._shm = SharedBlock()

    def connect(self, fleet: Fleet) -> None:
        init = {"init_info": {"transport": self.transport}}
        answers = fleet.post_all("/init_weight_transfer_engine", json=init)
        served = {url: answer["dtype"] for url, answer in answers.items()}
        if len(set(served.values())) > 1:
            raise SyncFailure(
                {url: f"serves {d}; the fleet must serve one dtype" for url, d in served.items()}
            )
        self.dtype = DTYPES[next(iter(served.values()))]

    def send(self, fleet: Fleet, weights: PushedWeights, version: str) -> None:
        fleet.post_all("/start_weight_update")
        self._sent = {}
        for chunk in chunks(weights.tensors(), self.chunk_bytes, self.dtype):
            if self.checksum:
                self._sent.update(checksums(chunk))
            if self.transport == "http":
                body = safetensors_bytes(chunk)
                headers = {"content-type": "application/octet-stream"}
                fleet.post_all("/update_weights", content=body, headers=headers)
            else:
                info = self._shm.pack(chunk)
                fleet.post_all("/update_weights", json={"update_info": info})

    def finish(self, fleet: Fleet, version: str) -> None:
        fleet.post_all("/finish_weight_update", json={"weight_version": version})

    def after_swap(self, fleet: Fleet, recompute_kv: bool) -> None:
        if recompute_kv:
            fleet.post_all("/reset_prefix_cache", params={"reset_running_requests": "true"})

    def sent_checksums(self) -> dict[str, str] | None:
        return self._sent if self.checksum else None

    def close(self) -> None:
        self._shm.release()
