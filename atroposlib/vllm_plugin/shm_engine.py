"""vLLM's worker side of the ``shm`` weight transfer: chunks out of POSIX shared memory.

One update is staged whole before it touches the model: every ``update_weights`` chunk is
copied out of the trainer's block, checked against the served checkpoint's tensor names and
shapes (a wrong name or shape is refused with a message naming it, and the served weights stay
as they were), and kept in the served dtype; ``finish_weight_update`` loads the staged tensors
with vLLM's layerwise reload (Hugging Face names in, vLLM's fused layout out), the same path
its ``reload_weights`` takes from disk, then re-packs the CPU GEMMs that reload leaves stale
(:mod:`atroposlib.vllm_plugin.cpu_reload`). Runs in vLLM's worker processes; imports vLLM.

A chunk's block is opened on the embedded server's terms (:class:`BlockClaim`): its name starts
with the random ``shm_prefix`` the trainer gave ``/init_weight_transfer_engine`` (vLLM answers
that route with a fixed message, so the prefix travels the other way), and the block is this
user's, mode 0600 and of the declared ``shm_bytes``. A request naming any other block is refused
with a message naming the field.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from atroposlib.inference.weight_transfer import (
    BlockClaim,
    TransferError,
    checked_shm_prefix,
    read_shared_memory,
)

logger = logging.getLogger(__name__)

Layout = dict[str, tuple[int, ...]]


@dataclass
class SharedMemoryInitInfo(WeightTransferInitInfo):
    """Nothing to rendezvous: the trainer and the workers share this machine's /dev/shm."""

    shm_prefix: str | None = None
    """Every block of this session is named with it (``new_shm_prefix()``); required."""


@dataclass
class SharedMemoryUpdateInfo(WeightTransferUpdateInfo):
    """One chunk: tensors packed back to back in the block ``shm_name``, in this order."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    shm_name: str
    shm_bytes: int | None = None
    """The block's size (required); the block must also be this user's and mode 0600."""


class SharedMemoryWeightTransferEngine(
    WeightTransferEngine[SharedMemoryInitInfo, SharedMemoryUpdateInfo]
):
    init_info_cls = SharedMemoryInitInfo
    update_info_cls = SharedMemoryUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._staged: dict[str, Tensor] = {}
        self._layout: Layout | None = None
        self._layout_of: str | None = None
        self._prefix: str | None = None

    def init_transfer_engine(self, init_info: SharedMemoryInitInfo) -> None:
        """No data-plane set-up: the prefix of the blocks this session may name."""
        self._prefix = checked_shm_prefix(init_info.shm_prefix)

    def start_weight_update(self) -> None:
        self._staged = {}
        self._layout = self._checkpoint_layout()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class synchronizes torch.accelerator, which a CPU build does not have
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: SharedMemoryUpdateInfo) -> None:
        if self._prefix is None:
            raise TransferError(
                "update_info.shm_name",
                "no shm_prefix yet: call /init_weight_transfer_engine with init_info.shm_prefix",
            )
        if update_info.shm_bytes is None:
            raise TransferError("update_info.shm_bytes", "required: the block's size in bytes")
        claim = BlockClaim(self._prefix, update_info.shm_bytes)
        chunk = read_shared_memory(
            update_info.shm_name,
            update_info.names,
            update_info.dtype_names,
            update_info.shapes,
            dtype=self.model_config.dtype,
            block=claim,
        )
        if self._layout is not None:
            for name, tensor in chunk.items():
                want = self._layout.get(name)
                if want is None:
                    raise TransferError(name, "the served checkpoint has no tensor of this name")
                if tuple(tensor.shape) != want:
                    raise TransferError(
                        name, f"shape {list(tensor.shape)} does not match the served {list(want)}"
                    )
        self._staged.update(chunk)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        from atroposlib.vllm_plugin.cpu_reload import finish_reload

        staged, self._staged = self._staged, {}
        if not staged:
            raise TransferError("update_info", "the update sent no tensors")
        initialize_layerwise_reload(self.model)
        self.model.load_weights(iter(staged.items()))
        finish_reload(self.model, self.model_config)  # re-packs a tied LM head on CPU
        logger.info("installed %d tensors from shared memory", len(staged))

    def shutdown(self) -> None:
        self._staged = {}

    def _checkpoint_layout(self) -> Layout | None:
        """Tensor names and shapes of the served checkpoint (a local folder of safetensors
        files), read from the files' headers; None when there is no such folder to read."""
        folder = Path(str(self.model_config.model))
        if self._layout_of == str(folder):
            return self._layout
        files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
        layout: Layout = {}
        for file in files:
            layout.update(_safetensors_shapes(file))
        self._layout = layout or None
        self._layout_of = str(folder)
        if self._layout is None:
            logger.warning("no safetensors under %s: names and shapes are not checked", folder)
        return self._layout


def _safetensors_shapes(file: Path) -> Layout:
    """``{name: shape}`` from a safetensors file's JSON header (the tensors are not read)."""
    with file.open("rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(size))
    return {
        name: tuple(int(d) for d in entry["shape"])
        for name, entry in header.items()
        if name != "__metadata__"
    }
