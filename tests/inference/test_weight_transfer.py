"""Staging weight chunks (no server): one copy out of shared memory into the served dtype,
none for a decoded body already in it, and the copies on a lower-priority thread."""

from __future__ import annotations

import os
import threading
from multiprocessing import shared_memory

import pytest
import torch

from atroposlib.inference.weight_transfer import (
    STAGING_NICENESS,
    Staging,
    TransferError,
    stage_shared_memory,
    staging_executor,
)

EXPECTED = {"a": ((2, 3), torch.float32), "b": ((4,), torch.bfloat16)}


def test_a_shared_block_is_copied_once_into_the_served_dtypes() -> None:
    a, b = torch.arange(6.0).reshape(2, 3), torch.tensor([0.5, 1.5, -2.0, 3.0])
    raw = torch.cat([a.view(-1).view(torch.uint8), b.view(torch.uint8)])
    block = shared_memory.SharedMemory(create=True, size=raw.numel())
    try:
        torch.frombuffer(block.buf, dtype=torch.uint8, count=raw.numel()).copy_(raw)
        staging = Staging(EXPECTED)
        staged = stage_shared_memory(
            staging, block.name, ["a", "b"], ["float32", "float32"], [[2, 3], [4]]
        )
        assert staged == 2
        torch.frombuffer(block.buf, dtype=torch.uint8, count=raw.numel()).zero_()
    finally:
        block.close()
        block.unlink()
    # the staged tensors are the server's own: the block's later contents do not reach them
    assert torch.equal(staging.tensors["a"], a)
    assert staging.tensors["b"].dtype == torch.bfloat16
    assert torch.equal(staging.tensors["b"], b.to(torch.bfloat16))


def test_a_decoded_chunk_in_the_served_dtype_is_kept_without_a_copy() -> None:
    staging = Staging(EXPECTED)
    a = torch.ones(2, 3)
    staging.add({"a": a})
    assert staging.tensors["a"].data_ptr() == a.data_ptr()


def test_an_empty_chunk_names_the_field() -> None:
    block = shared_memory.SharedMemory(create=True, size=8)
    try:
        with pytest.raises(TransferError, match=r"update_info\.names"):
            stage_shared_memory(Staging(EXPECTED), block.name, [], [], [])
    finally:
        block.close()
        block.unlink()


def test_chunks_are_staged_on_a_lower_priority_thread() -> None:
    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    mine = niceness()
    pool = staging_executor()
    try:
        theirs = pool.submit(niceness).result()
    finally:
        pool.shutdown()
    assert theirs == min(mine + STAGING_NICENESS, 19)
    assert niceness() == mine  # the calling thread keeps its own
