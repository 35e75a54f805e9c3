"""What vLLM's trainer engines need from us for its NCCL and IPC transfers.

vLLM's own trainer engines (``WeightTransferTrainerFactory``) do the transfer; they read the
trainer's weights from a ``WeightSource`` (here :class:`CurrentWeights`: ``metadata()`` and
iteration, the two channels they use) and drive the servers through a four-method client
(here :class:`FleetClient`, which sends every call to every server of the fleet).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from example_trainer.inflight.fleet import Fleet
from example_trainer.inflight.tensors import NamedTensors


@dataclass(frozen=True)
class ParamMeta:
    """vLLM's ``ParamMeta`` fields: name, wire dtype, full shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


class CurrentWeights:
    """The weights of the push in progress (``current`` is set before each send)."""

    def __init__(self, dtype: torch.dtype | None) -> None:
        self.current: NamedTensors | None = None
        self.dtype = dtype

    def _pairs(self) -> Iterator[tuple[str, torch.Tensor]]:
        assert self.current is not None, "set CurrentWeights.current before sending"
        for name, tensor in self.current():
            yield name, tensor if self.dtype is None else tensor.to(self.dtype)

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self._pairs()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self._pairs()


class FleetClient:
    """vLLM's ``VLLMWeightSyncClient`` over HTTP, fanned out; ranks offset server by server."""

    def __init__(self, fleet: Fleet, world_sizes: dict[str, int]) -> None:
        self.fleet = fleet
        self.offsets: dict[str, int] = {}
        offset = 1  # the trainer is rank 0
        for url in fleet.urls:
            self.offsets[url] = offset
            offset += world_sizes[url]
        self.version: str | None = None

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        def init(url: str) -> Any:
            info = dict(init_info)
            if "rank_offset" in info:
                info["rank_offset"] = self.offsets[url]
            return self.fleet.request(
                "POST", url, "/init_weight_transfer_engine", json={"init_info": info}
            )

        self.fleet.each(init)

    def start_weight_update(self) -> None:
        self.fleet.post_all("/start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        if _has_ipc_handles(update_info):
            from vllm.distributed.weight_transfer.clients import _json_safe_update_payload

            update_info = _json_safe_update_payload(update_info)  # CUDA handles, pickled
        body = {"update_info": update_info}
        self.fleet.post_all("/update_weights", json=body)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        version = weight_version if weight_version is not None else self.version
        self.fleet.post_all("/finish_weight_update", json={"weight_version": version})


def _has_ipc_handles(update_info: Any) -> bool:
    infos = update_info if isinstance(update_info, list) else [update_info]
    return any(isinstance(info, dict) and info.get("ipc_handles") is not None for info in infos)
