"""The embedded server's control API (vLLM's routes), with chunks over HTTP or shared memory.

``http``: each chunk is a safetensors file POSTed to every server. ``shm``: each chunk is
written once into a POSIX shared-memory block (one block, reused) that every server (on this
machine) copies out of before it answers. Tensors are sent in the served dtype
(``/init_weight_transfer_engine`` says which), so their checksums can be compared with the
servers' exactly. The server stages the chunks beside the weights it serves, so they travel
before the pause, which covers only the swap. Each server owns its update by the token its
``/start_weight_update`` answered (sent with every later call), and opens only blocks named
with the prefix it announced: servers that announced different prefixes get one block each.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import torch
from safetensors.torch import save as safetensors_bytes

from atroposlib.inference.weight_transfer import DTYPES, checksums
from atroposlib.wire.engine import UPDATE_TOKEN_HEADER as UPDATE_TOKEN
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
        self._prefixes: dict[str, str] = {}  # server -> the shm_prefix it announced
        self._blocks: dict[str, SharedBlock] = {}  # one block per announced prefix
        self._tokens: dict[str, dict[str, str]] = {}  # server -> its update's token header

    def connect(self, fleet: Fleet) -> None:
        init = {"init_info": {"transport": self.transport}}
        answers = self._post_each(fleet, "/init_weight_transfer_engine", json=init)
        self._prefixes = {url: answer.get("shm_prefix") or "" for url, answer in answers.items()}
        if self.transport == "shm" and self._blocks.keys() - set(self._prefixes.values()):
            self.close()  # blocks named for prefixes no server announces any more
        served = {url: answer["dtype"] for url, answer in answers.items()}
        if len(set(served.values())) > 1:
            raise SyncFailure(
                {url: f"serves {d}; the fleet must serve one dtype" for url, d in served.items()}
            )
        self.dtype = DTYPES[next(iter(served.values()))]

    def send(self, fleet: Fleet, weights: PushedWeights, version: str) -> None:
        started = self._post_each(fleet, "/start_weight_update")
        self._tokens = {
            url: {UPDATE_TOKEN: answer["update_token"]}
            for url, answer in started.items()
            if isinstance(answer, dict) and answer.get("update_token")
        }
        self._sent = {}
        for chunk in chunks(weights.tensors(), self.chunk_bytes, self.dtype):
            if self.checksum:
                self._sent.update(checksums(chunk))
            if self.transport == "http":
                body = safetensors_bytes(chunk)
                octets = {"content-type": "application/octet-stream"}
                self._post_each(fleet, "/update_weights", content=body, headers=octets)
            else:
                prefixes = set(self._prefixes.values())
                infos = {prefix: self._block(prefix).pack(chunk) for prefix in prefixes}
                self._send_blocks(fleet, infos)

    def _send_blocks(self, fleet: Fleet, infos: dict[str, dict[str, Any]]) -> None:
        """Each server the ``update_info`` of the block named with its prefix."""
        fleet.each(
            lambda url: fleet.request(
                "POST", url, "/update_weights",
                json={"update_info": infos[self._prefixes[url]]},
                headers=self._tokens.get(url, {}),
            )
        )  # fmt: skip

    def finish(self, fleet: Fleet, version: str) -> None:
        self._post_each(fleet, "/finish_weight_update", json={"weight_version": version})
        self._tokens = {}

    def _post_each(
        self, fleet: Fleet, path: str, headers: dict[str, str] | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """POST to every server with its own update token (when it gave one)."""
        return fleet.each(
            lambda url: fleet.request(
                "POST",
                url,
                path,
                headers={**(headers or {}), **self._tokens.get(url, {})},
                **kwargs,
            )
        )

    def _block(self, prefix: str) -> SharedBlock:
        """The block for servers that announced ``prefix`` (one copy per distinct prefix:
        each server opens only blocks named with its own)."""
        if prefix not in self._blocks:
            self._blocks[prefix] = SharedBlock(prefix)
        return self._blocks[prefix]

    def after_swap(self, fleet: Fleet, recompute_kv: bool) -> None:
        if recompute_kv:
            fleet.post_all("/reset_prefix_cache", params={"reset_running_requests": "true"})

    def sent_checksums(self) -> dict[str, str] | None:
        return self._sent if self.checksum else None

    def close(self) -> None:
        for block in self._blocks.values():
            block.release()
        self._blocks = {}
