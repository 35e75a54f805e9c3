"""Multi-process plumbing for torchrun: process group, batch broadcast, DDP / FSDP2 helpers."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from example_trainer.checkpoint import unwrap


def init_distributed() -> tuple[int, int, torch.device]:
    """-> (rank, world size, device); a no-op outside torchrun. Under torchrun the process
    group exists with one rank too, so ``--parallel fsdp`` shards on a single GPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    launched = "MASTER_ADDR" in os.environ and "WORLD_SIZE" in os.environ
    if launched and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return (dist.get_rank() if world > 1 else 0), world, device


def broadcast(obj: Any, world: int) -> Any:
    """Rank 0's object on every rank."""
    if world == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def summed_over_ranks(sums: dict[str, torch.Tensor], world: int) -> dict[str, float]:
    """The sums of every rank, as floats, ``loss`` first (one all-reduce)."""
    keys = ["loss", *sorted(k for k in sums if k != "loss")]
    packed = torch.stack([sums[k] for k in keys])
    if world > 1:
        dist.all_reduce(packed)
    return dict(zip(keys, packed.tolist(), strict=True))


def shard_model(model: nn.Module) -> None:
    """FSDP2: shard each transformer block, then the rest (embeddings, head)."""
    from torch.distributed.fsdp import fully_shard

    blocks = set(getattr(unwrap(model), "_no_split_modules", None) or ["LlamaDecoderLayer"])
    for module in list(model.modules()):
        if type(module).__name__ in blocks:
            fully_shard(module)
    fully_shard(model)


def grad_sync(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager[Any]:
    """Skip the gradient all-reduce / reduce-scatter on all but the last micro-batch."""
    if isinstance(model, nn.parallel.DistributedDataParallel) and not enabled:
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        getattr(model, "set_requires_gradient_sync")(enabled)  # noqa: B009
    return contextlib.nullcontext()
