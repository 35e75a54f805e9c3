"""A process group between the trainer's rank 0 and inference workers, beside any other group.

SGLang's workers join ``/init_weights_update_group`` through torch's TCP rendezvous with a
store prefixed by the group name; the trainer (rank 0, which hosts the store) must create the
same group, which may not be torch's default group (under torchrun that one is the
trainer's own). torch has no public call for a second, independently rendezvoused group, so
this uses ``distributed_c10d``'s helpers as the inference engines themselves do.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
from torch.distributed import distributed_c10d as c10d


def join_group(
    master_address: str,
    master_port: int,
    world_size: int,
    rank: int,
    group_name: str,
    backend: str = "nccl",
    timeout_s: float = 300.0,
) -> Any:
    """Join (rank 0: host) a group of ``world_size`` ranks; returns the process group."""
    timeout = timedelta(seconds=timeout_s)
    url = f"tcp://{master_address}:{master_port}"
    store, rank, world_size = next(c10d.rendezvous(url, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    prefixed = c10d.PrefixStore(group_name, store)
    group, _ = c10d._new_process_group_helper(
        world_size,
        rank,
        [],
        backend,
        prefixed,
        group_name=c10d.GroupName(group_name),
        timeout=timeout,
    )
    c10d._world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def broadcast(tensor: torch.Tensor, group: Any) -> None:
    """Send (rank 0) or receive ``tensor`` in place to/from every rank of ``group``."""
    torch.distributed.broadcast(tensor, src=0, group=group)


def leave_group(group: Any) -> None:
    torch.distributed.destroy_process_group(group)
