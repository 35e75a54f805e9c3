"""One POSIX shared-memory block that carries weight chunks to inference servers on this
machine (the ``shm`` transport of the embedded server and of our vLLM plugin): the tensors
back to back, named in an ``update_info`` of vLLM's fields (names, dtype_names, shapes) plus
the block's name and size. The servers copy out of the block before they answer, so it is
reused. A server opens only blocks whose name starts with the session's prefix (``shm_prefix``:
the embedded server announces its own, our vLLM engine takes the trainer's), owned by its user,
mode 0600 and of the declared size."""

from __future__ import annotations

import secrets
from multiprocessing import shared_memory
from typing import Any

import torch
from torch import Tensor

from atroposlib.inference.weight_transfer import dtype_name


class SharedBlock:
    """One POSIX shared-memory block reused for every chunk of every push (grown when a chunk
    needs more): a fresh block per chunk spends most of a push faulting its pages in."""

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix
        self._block: shared_memory.SharedMemory | None = None

    def pack(self, chunk: dict[str, Tensor]) -> dict[str, Any]:
        """The chunk copied back to back into the block; the ``update_info`` naming it."""
        sizes = [t.numel() * t.element_size() for t in chunk.values()]
        block = self._fit(max(1, sum(sizes)))
        offset = 0
        for tensor, size in zip(chunk.values(), sizes, strict=True):
            target = torch.frombuffer(block.buf, dtype=torch.uint8, count=size, offset=offset)
            target.copy_(tensor.view(-1).view(torch.uint8))
            del target  # the block cannot close while a tensor points into it
            offset += size
        return {
            "names": list(chunk),
            "dtype_names": [dtype_name(t.dtype) for t in chunk.values()],
            "shapes": [list(t.shape) for t in chunk.values()],
            "shm_name": block.name,
            "shm_bytes": block.size,
        }

    def _fit(self, size: int) -> shared_memory.SharedMemory:
        if self._block is None or self._block.size < size:
            self.release()
            name = None if self.prefix is None else self.prefix + secrets.token_hex(8)
            self._block = shared_memory.SharedMemory(name=name, create=True, size=size)
        return self._block

    def release(self) -> None:
        if self._block is not None:
            self._block.close()
            self._block.unlink()
            self._block = None
