"""vLLM's native weight transfer (its RL routes; the server runs with VLLM_SERVER_DEV_MODE=1).

Backends, as the installed vLLM offers them (``weight_sync_transport``):

- ``nccl``: vLLM's trainer engine broadcasts from the trainer's rank 0 to the workers of every
  server (one group: the trainer, then each server's workers at its rank offset); servers
  started with ``--weight-transfer-config '{"backend": "nccl"}'``; chunked by vLLM's packed
  buffers (``weight_sync_chunk_mb``);
- ``ipc``: CUDA IPC handles, trainer and server on one GPU (``{"backend": "ipc"}``, and
  ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` on the server for handles sent over HTTP);
- ``shm``: our engine (:mod:`atroposlib.vllm_plugin`, servers started with
  ``--weight-transfer-config '{"backend": "shm"}'``), for vLLM's CPU build: each chunk is
  written into a POSIX shared-memory block on the server's machine and every worker copies it
  out; the workers stage the whole update and install it at ``/finish_weight_update``, so the
  chunks travel before the pause, which covers only the swap;
- ``disk``: no transfer engine: the trainer writes a folder and every server reloads it in
  place (``/collective_rpc`` ``reload_weights``), then takes the version label
  (``/update_weight_version``). Works wherever vLLM runs, CPU builds included.

Every call goes to every server; the prefix cache is reset after the swap (with
``recompute_kv`` the running requests' KV too, ``reset_running_requests=true``); the weight
checker's checksums must agree across the fleet (its parameter names and layouts are vLLM's,
so they are not compared with the trainer's).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import torch

from atroposlib.inference.weight_transfer import new_shm_prefix
from example_trainer.inflight.driver import VllmRoutes
from example_trainer.inflight.fleet import Fleet, SyncFailure
from example_trainer.inflight.shm import SharedBlock
from example_trainer.inflight.tensors import PushedWeights, chunks

logger = logging.getLogger(__name__)

Backend = Literal["nccl", "ipc", "shm", "disk"]


class VllmEngine(VllmRoutes):
    """``weight_sync: vllm``."""

    def __init__(
        self,
        backend: Backend = "nccl",
        *,
        chunk_bytes: int = 1 << 30,
        master_address: str = "127.0.0.1",
        master_port: int = 29600,
        dtype: torch.dtype | None = None,
        transfer_factory: Any = None,
    ) -> None:
        self.backend, self.chunk_bytes, self.dtype = backend, chunk_bytes, dtype
        # vLLM's own engines write the chunks into the served weights (pause first); ours
        # stages them beside the served weights until the finish
        self.stages_before_pause = backend == "shm"
        # the engine opens only blocks named with the prefix this trainer announces at init
        self._shm = SharedBlock(new_shm_prefix())
        self.master_address, self.master_port = master_address, master_port
        self._factory = transfer_factory  # injected in tests; vLLM's trainer factory otherwise
        self._transfer: Any = None
        self._source: Any = None
        self._client: Any = None
        self.cache_resets_refused = 0

    def connect(self, fleet: Fleet) -> None:
        if self.backend == "shm":
            init = {"init_info": {"shm_prefix": self._shm.prefix}}
            fleet.post_all("/init_weight_transfer_engine", json=init)
            return
        if self.backend == "disk" or self._transfer is not None:
            return  # a transfer engine, once set up, is kept across failed pushes
        from example_trainer.inflight.vllm_client import CurrentWeights, FleetClient

        sizes = {
            url: int(answer["world_size"])
            for url, answer in fleet.get_all(
                "/get_world_size", params={"include_dp": "true"}
            ).items()
        }
        self._client = FleetClient(fleet, sizes)
        self._source = CurrentWeights(self.dtype)
        factory, info = self._init_info(1 + sum(sizes.values()))
        self._transfer = factory.trainer_init(info, client=self._client, source=self._source)

    def _init_info(self, world_size: int) -> tuple[Any, Any]:
        """vLLM's trainer factory and the init info of the backend (a plain dict for an
        injected factory, so the control flow is testable without vLLM)."""
        wire = {"packed": True, "packed_buffer_size_bytes": self.chunk_bytes}
        if self._factory is not None:
            return self._factory, {"backend": self.backend, "world_size": world_size, **wire}
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        if self.backend == "ipc":
            from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

            return WeightTransferTrainerFactory, IPCTrainerInitInfo(rank=0, **wire)
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        info = NCCLTrainerInitInfo(
            master_address=self.master_address,
            master_port=self.master_port,
            world_size=world_size,
            rank=0,
            **wire,
        )
        return WeightTransferTrainerFactory, info

    def send(self, fleet: Fleet, weights: PushedWeights, version: str) -> None:
        if self.backend == "disk":
            folder = weights.folder()
            missing = _not_a_checkpoint(folder)
            if missing:  # vLLM-CPU would unload the served weights, then fail: its next step dies
                raise SyncFailure(dict.fromkeys(fleet.urls, missing), final=True)
            rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
            fleet.post_all("/collective_rpc", json=rpc)
            return
        if self.backend == "shm":
            fleet.post_all("/start_weight_update")
            for chunk in chunks(weights.tensors(), self.chunk_bytes, self.dtype):
                fleet.post_all("/update_weights", json={"update_info": self._shm.pack(chunk)})
            return
        self._source.current = weights.tensors
        self._client.version = version
        self._transfer.send_weights()  # start, update (chunked), finish with the version

    def finish(self, fleet: Fleet, version: str) -> None:
        if self.backend == "shm":
            fleet.post_all("/finish_weight_update", json={"weight_version": version})
        elif self.backend == "disk":
            fleet.post_all("/update_weight_version", json={"new_version": version})

    def after_swap(self, fleet: Fleet, recompute_kv: bool) -> None:
        flag = "true" if recompute_kv else "false"
        answers = fleet.post_all("/reset_prefix_cache", params={"reset_running_requests": flag})
        refused = [
            url for url, a in answers.items() if isinstance(a, dict) and not a.get("success")
        ]
        if refused:  # blocks held by frozen requests (keep mode without recompute_kv)
            first = self.cache_resets_refused == 0
            self.cache_resets_refused += len(refused)
            (logger.warning if first else logger.info)(
                "prefix cache not reset on %s: requests in flight hold its blocks, so a new "
                "request that starts with a cached prefix (a group's prompt, a conversation's "
                "earlier turns) reuses keys/values of the earlier weights; --sync-recompute-kv "
                "true resets it (the requests in flight recompute theirs)",
                refused,
            )

    def sent_checksums(self) -> dict[str, str] | None:
        return None

    def close(self) -> None:
        self._shm.release()
        if self._transfer is not None and hasattr(self._transfer, "shutdown"):
            self._transfer.shutdown()


def _not_a_checkpoint(folder: Path) -> str | None:
    """Why vLLM could not reload ``folder`` (None when it holds a config and safetensors)."""
    if not (folder / "config.json").is_file():
        return f"reload_weights: no checkpoint at {folder} (config.json missing)"
    if not any(folder.glob("*.safetensors")):
        return f"reload_weights: no *.safetensors files in {folder}"
    return None
