"""Weights that arrive while the server generates: decoded, checked and staged until installed.

The control API follows vLLM's four phases (``/init_weight_transfer_engine``,
``/start_weight_update``, any number of ``/update_weights`` chunks, ``/finish_weight_update``).
A chunk travels one of two ways, both on CPU:

- ``http``: the request body is a safetensors file holding the chunk's tensors;
- ``shm``: the trainer writes the tensors back to back into a POSIX shared-memory block and
  the JSON body names the block with each tensor's name, dtype, shape and byte size (vLLM's
  ``update_info`` fields for its packed IPC transfer).

Chunks are copied (once) into a staging area in the served dtype, beside the served weights,
so the server keeps generating while they arrive; ``finish`` hands the staged tensors to the
worker, which swaps them in between two decode steps (:meth:`ModelRunner.install`). The copies
run on one thread of their own (:func:`staging_executor`).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import resource_tracker, shared_memory
from typing import TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from torch import Tensor

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
T = TypeVar("T")

_SHM_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
_SHM_PREFIX = re.compile(r"^atropos_[0-9a-f]{16,64}_$")


def new_shm_prefix() -> str:
    """A random prefix for the shared-memory blocks of one weight-transfer session."""
    return f"atropos_{secrets.token_hex(8)}_"


def checked_shm_prefix(prefix: str | None, field: str = "init_info.shm_prefix") -> str:
    """``prefix`` when it is one :func:`new_shm_prefix` makes: a caller cannot widen the names
    a server opens to blocks that are not ours (``""`` would let it name any block)."""
    if prefix is None or not _SHM_PREFIX.match(prefix):
        raise TransferError(
            field, "must be 'atropos_' + 16 to 64 random hex digits + '_' (new_shm_prefix())"
        )
    return prefix


def staging_executor() -> ThreadPoolExecutor:
    """One thread that decodes and copies weight chunks: at most one core's worth of copying
    beside the decode thread, and none of the event loop's default threads held by it.

    (A lower OS priority for it was tried: on a machine shared with other jobs it starved the
    copies and lengthened the trainer's push by ~40 % without a measurable gain in decode.)"""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-staging")


class TransferError(ValueError):
    """A chunk that cannot be staged; the message names the field or parameter and the fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (vLLM's ``dtype_names`` spelling)."""
    return str(dtype).removeprefix("torch.")


@dataclass
class Staging:
    """One weight update session: the chunks received so far, in the served dtypes."""

    expected: Mapping[str, tuple[tuple[int, ...], torch.dtype]]
    tensors: dict[str, Tensor] = field(default_factory=dict)
    chunks: int = 0
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    """The owner's capability: whoever started the update holds it, no one else."""
    touched: float = field(default_factory=time.monotonic)
    """When the owner last called (``time.monotonic``)."""

    @property
    def staged_bytes(self) -> int:
        """Bounded by the served model: only its parameters, each at most once, are staged."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def add(self, chunk: Mapping[str, Tensor], owned: bool = True) -> int:
        """Check every tensor of ``chunk`` against the served parameter, then stage them all.

        ``owned``: the tensors are this server's (a decoded request body) and are kept as
        they are when already in the served dtype; otherwise (views of a shared-memory block)
        each is copied, once, into a tensor of the served dtype."""
        if not chunk:
            raise TransferError(
                "update_info.names", "the chunk holds no tensors; send at least one"
            )
        for name, tensor in chunk.items():
            want = self.expected.get(name)
            if want is None:
                raise TransferError(name, "the served model has no parameter of this name")
            if tuple(tensor.shape) != want[0]:
                raise TransferError(
                    name, f"shape {list(tensor.shape)} does not match the served {list(want[0])}"
                )
            if not tensor.is_floating_point():
                raise TransferError(name, f"dtype {tensor.dtype} is not a floating point type")
        for name, tensor in chunk.items():
            dtype = self.expected[name][1]
            if owned:
                self.tensors[name] = tensor.to(dtype).contiguous()
            else:
                self.tensors[name] = torch.empty(tensor.shape, dtype=dtype).copy_(tensor)
        self.chunks += 1
        return len(chunk)


def expected_parameters(
    params: Mapping[str, torch.nn.Parameter],
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {name: (tuple(p.shape), p.dtype) for name, p in params.items()}


def read_safetensors(body: bytes) -> dict[str, Tensor]:
    """The tensors of a safetensors file sent as the request body."""
    try:
        return dict(load_safetensors(body))
    except (SafetensorError, ValueError) as error:
        raise TransferError(
            "body", f"not a safetensors file ({error}); send safetensors.torch.save(tensors)"
        ) from error


def stage_shared_memory(
    staging: Staging,
    shm_name: str,
    names: list[str],
    dtype_names: list[str],
    shapes: list[list[int]],
    block: BlockClaim | None = None,
) -> int:
    """Stage the tensors packed back to back (in order, no padding) in a shared block,
    copied straight out of the block (one copy each); how many were staged."""
    return use_shared_memory(
        shm_name,
        names,
        dtype_names,
        shapes,
        lambda views: staging.add(views, owned=False),
        block,
    )


def read_shared_memory(
    shm_name: str,
    names: list[str],
    dtype_names: list[str],
    shapes: list[list[int]],
    dtype: torch.dtype | None = None,
    block: BlockClaim | None = None,
) -> dict[str, Tensor]:
    """Copies of the tensors packed in a shared block, in ``dtype`` when given (one copy)."""
    return use_shared_memory(
        shm_name,
        names,
        dtype_names,
        shapes,
        lambda views: {name: _copy(view, dtype) for name, view in views.items()},
        block,
    )


def _copy(view: Tensor, dtype: torch.dtype | None) -> Tensor:
    cast = dtype is not None and view.is_floating_point()
    return view.to(dtype if cast else view.dtype, copy=True)


def use_shared_memory(
    shm_name: str,
    names: list[str],
    dtype_names: list[str],
    shapes: list[list[int]],
    use: Callable[[dict[str, Tensor]], T],
    claim: BlockClaim | None = None,
) -> T:
    """``use(views)`` of the tensors packed back to back (in order, no padding) in a shared
    block; the views point into the block and are gone when this returns. With a ``claim``,
    the block is used only when it is what the caller says (:meth:`BlockClaim.check`)."""
    if not _SHM_NAME.match(shm_name):
        raise TransferError("update_info.shm_name", "must be a plain shared-memory block name")
    if claim is not None and not shm_name.startswith(claim.prefix):
        raise TransferError(
            "update_info.shm_name",
            "must start with the shm_prefix of /init_weight_transfer_engine",
        )
    if not len(names) == len(dtype_names) == len(shapes):
        raise TransferError(
            "update_info", "names, dtype_names and shapes must have one entry per tensor"
        )
    dtypes: list[torch.dtype] = []
    for name, spelled in zip(names, dtype_names, strict=True):
        if spelled not in DTYPES:
            raise TransferError(f"update_info.dtype_names[{name}]", f"use one of {sorted(DTYPES)}")
        dtypes.append(DTYPES[spelled])
    sizes = [_numel(shape) * _itemsize(dtype) for shape, dtype in zip(shapes, dtypes, strict=True)]
    try:
        block = _attach(shm_name)
    except FileNotFoundError as error:
        raise TransferError(
            "update_info.shm_name", "no shared-memory block of this name"
        ) from error
    except (OSError, ValueError) as error:  # another user's block, an empty one
        raise TransferError(
            "update_info.shm_name", "the block cannot be opened by this server (its owner?)"
        ) from error
    views: dict[str, Tensor] = {}
    try:
        if claim is not None:
            claim.check(os.fstat(block._fd), sum(sizes))  # type: ignore[attr-defined]
        elif sum(sizes) > block.size:
            raise TransferError(
                "update_info", f"the tensors need {sum(sizes)} bytes, more than the block holds"
            )
        offset = 0
        for name, dtype, shape, size in zip(names, dtypes, shapes, sizes, strict=True):
            views[name] = (
                torch.frombuffer(block.buf, dtype=torch.uint8, count=size, offset=offset)
                .view(dtype)
                .reshape(shape)
            )
            offset += size
        return use(views)
    finally:
        views.clear()  # the block cannot close while a tensor points into it
        block.close()


@dataclass(frozen=True)
class BlockClaim:
    """What the caller of ``/update_weights`` says of its block: the name prefix this server
    announced and the block's size (``shm_bytes``); the block must also belong to this user
    and be readable by no one else (mode 0600, as ``SharedMemory(create=True)`` makes it)."""

    prefix: str
    declared_bytes: int

    def check(self, found: os.stat_result, needed: int) -> None:
        """TransferError naming the first thing wrong; never tells the block's size."""
        field = "update_info.shm_name"
        if found.st_uid != os.geteuid():
            raise TransferError(field, "the block belongs to another user")
        if stat.S_IMODE(found.st_mode) != 0o600:
            raise TransferError(field, "the block's mode must be 0600 (owner only)")
        if found.st_size != self.declared_bytes:
            raise TransferError("update_info.shm_bytes", "is not the block's size")
        if needed > self.declared_bytes:
            raise TransferError(
                "update_info", f"the tensors need {needed} bytes, more than shm_bytes"
            )


def _attach(name: str) -> shared_memory.SharedMemory:
    """Open an existing block without letting this process's tracker unlink it at exit."""
    block = shared_memory.SharedMemory(name=name)
    resource_tracker.unregister(block._name, "shared_memory")  # type: ignore[attr-defined]
    return block


def _numel(shape: Iterable[int]) -> int:
    count = 1
    for dim in shape:
        if dim < 0:
            raise TransferError("update_info.shapes", "dimensions must be >= 0")
        count *= dim
    return count


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def checksums(params: Mapping[str, Tensor]) -> dict[str, str]:
    """sha256 of each tensor's bytes, keyed by name (the digest vLLM's weight checker uses)."""
    return {
        name: hashlib.sha256(
            tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        ).hexdigest()
        for name, tensor in params.items()
    }
