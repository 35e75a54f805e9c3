"""SGLang's native weight updates: a distributed (NCCL) group, or an in-place reload from disk.

- ``distributed``: ``/init_weights_update_group`` once (every server's workers join one group
  after the trainer's rank 0, each at its rank offset), then per chunk
  ``/update_weights_from_distributed {names, dtypes, shapes}`` on every server while the
  trainer broadcasts those tensors in that order; the last chunk carries ``weight_version``;
- ``disk``: ``/update_weights_from_disk {model_path, weight_version, abort_all_requests:
  false}`` on every server.

Pause modes: ``keep`` is ``/pause_generation {"mode": "in_place"}`` (requests keep their KV
cache; SGLang cannot flush its radix cache while they hold it, so the update does not ask
it to) or, with ``recompute_kv``, ``"retract"`` (requests go back to the queue and recompute
their KV under the new weights; the cache is flushed); ``abort`` is ``{"mode": "abort"}``;
``wait`` sends no pause: SGLang's update waits for the requests in flight by itself.
``/continue_generation`` resumes; ``/get_weight_version`` reads the version back. SGLang has no
weight checker, so ``verify: checksum`` checks versions only (logged once).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Literal

import torch

from example_trainer.inflight.driver import PauseMode
from example_trainer.inflight.fleet import Fleet, SyncFailure
from example_trainer.inflight.groups import broadcast, join_group, leave_group
from example_trainer.inflight.tensors import PushedWeights, chunks, with_last

logger = logging.getLogger(__name__)

Method = Literal["distributed", "disk"]
GROUP_NAME = "atroposlib_weight_update"


class SglangEngine:
    """``weight_sync: sglang``."""

    stages_before_pause = False

    def __init__(
        self,
        method: Method = "distributed",
        *,
        chunk_bytes: int = 1 << 30,
        master_address: str = "127.0.0.1",
        master_port: int = 29600,
        group_backend: str = "nccl",
        recompute_kv: bool = False,
        dtype: torch.dtype | None = None,
        timeout_s: float = 300.0,
    ) -> None:
        self.method, self.chunk_bytes, self.dtype = method, chunk_bytes, dtype
        self.master_address, self.master_port = master_address, master_port
        self.group_backend, self.recompute_kv, self.timeout_s = (
            group_backend,
            recompute_kv,
            timeout_s,
        )
        self._group: Any = None
        self._fleet: Fleet | None = None
        self._paused: str | None = None
        self._warned_checksum = False

    def connect(self, fleet: Fleet) -> None:
        if self.method == "disk":
            return
        self._fleet = fleet
        if self._group is not None:  # set up again after a failed push
            self._leave(fleet)
        info = fleet.get_all("/get_server_info")
        sizes = {
            url: int(a.get("tp_size", 1)) * int(a.get("pp_size", 1)) for url, a in info.items()
        }
        world = 1 + sum(sizes.values())
        offsets, offset = {}, 1
        for url in fleet.urls:
            offsets[url], offset = offset, offset + sizes[url]
        body = {
            "master_address": self.master_address, "master_port": self.master_port,
            "world_size": world, "group_name": GROUP_NAME, "backend": self.group_backend,
        }  # fmt: skip
        joined: list[Any] = []

        def trainer_side() -> None:
            address, port, backend = self.master_address, self.master_port, self.group_backend
            joined.append(join_group(address, port, world, 0, GROUP_NAME, backend, self.timeout_s))

        thread = threading.Thread(target=trainer_side, daemon=True)
        thread.start()  # the servers' workers and the trainer rendezvous together
        fleet.each(
            lambda url: fleet.request(
                "POST",
                url,
                "/init_weights_update_group",
                json={**body, "rank_offset": offsets[url]},
            )
        )
        thread.join(self.timeout_s)
        if not joined:
            raise SyncFailure({url: "its workers joined no weight group" for url in fleet.urls})
        self._group = joined[0]

    def pause(self, fleet: Fleet, mode: PauseMode) -> None:
        if mode == "wait":
            self._paused = None  # the update itself waits for the requests in flight
            return
        sglang_mode = "abort" if mode == "abort" else "retract" if self.recompute_kv else "in_place"
        fleet.post_all("/pause_generation", json={"mode": sglang_mode})
        self._paused = sglang_mode

    def send(self, fleet: Fleet, weights: PushedWeights, version: str) -> None:
        flush = self._paused != "in_place"  # SGLang cannot flush under requests kept in place
        if self.method == "disk":
            body = {
                "model_path": str(weights.folder()), "weight_version": version,
                "abort_all_requests": False, "flush_cache": flush,
            }  # fmt: skip
            fleet.post_all("/update_weights_from_disk", json=body)
            return
        for chunk, last in with_last(chunks(weights.tensors(), self.chunk_bytes, self.dtype)):
            body = {
                "names": list(chunk),
                "dtypes": [str(t.dtype).removeprefix("torch.") for t in chunk.values()],
                "shapes": [list(t.shape) for t in chunk.values()],
                "group_name": GROUP_NAME, "flush_cache": flush and last,
                "abort_all_requests": False, "weight_version": version if last else None,
            }  # fmt: skip
            self._broadcast_chunk(fleet, body, list(chunk.values()))

    def _broadcast_chunk(
        self, fleet: Fleet, body: dict[str, Any], tensors: list[torch.Tensor]
    ) -> None:
        """The servers receive (their request blocks in the group) while the trainer sends."""
        answers: list[Any] = []

        def servers_receive() -> None:
            try:
                answers.append(fleet.post_all("/update_weights_from_distributed", json=body))
            except SyncFailure as failure:
                answers.append(failure)

        thread = threading.Thread(target=servers_receive, daemon=True)
        thread.start()
        device = "cuda" if self.group_backend == "nccl" else "cpu"
        try:
            for tensor in tensors:
                if answers and isinstance(answers[0], SyncFailure):
                    raise answers[0]  # a server refused before joining: nobody will receive
                broadcast(tensor.to(device), self._group)
        except RuntimeError as error:  # the group timed out or broke
            raise SyncFailure(
                {url: f"weight broadcast failed: {error}" for url in fleet.urls}
            ) from error
        thread.join(self.timeout_s)
        if not answers:
            raise SyncFailure({url: "no answer to the weight update" for url in fleet.urls})
        if isinstance(answers[0], SyncFailure):
            raise answers[0]

    def finish(self, fleet: Fleet, version: str) -> None:
        """The version rides on the (last) update request."""

    def after_swap(self, fleet: Fleet, recompute_kv: bool) -> None:
        """The update flushed the cache (unless requests were kept in place)."""

    def resume(self, fleet: Fleet) -> None:
        if self._paused is not None:
            fleet.post_all("/continue_generation", json={})
            self._paused = None

    def versions(self, fleet: Fleet) -> dict[str, str]:
        answers = fleet.get_all("/get_weight_version")
        return {url: str(a["weight_version"]) for url, a in answers.items()}

    def checksums(self, fleet: Fleet) -> dict[str, dict[str, str]] | None:
        if not self._warned_checksum:
            logger.warning("SGLang has no weight checker: weight syncs are verified by version")
            self._warned_checksum = True
        return None

    def sent_checksums(self) -> dict[str, str] | None:
        return None

    def close(self) -> None:
        if self._group is not None and self._fleet is not None:
            self._leave(self._fleet)

    def _leave(self, fleet: Fleet) -> None:
        """Leave the weight group, and ask every server to forget it (best effort)."""
        leave_group(self._group)
        self._group = None
        forget = {"group_name": GROUP_NAME}
        fleet.each(lambda url: _quietly(fleet, url, "/destroy_weights_update_group", forget))


def _quietly(fleet: Fleet, url: str, path: str, body: dict[str, Any]) -> None:
    """A best-effort call (its failure is logged, not raised)."""
    try:
        fleet.request("POST", url, path, json=body)
    except SyncFailure as failure:
        logger.info("%s", failure)
