"""Staging weight chunks (no server): one copy out of shared memory into the served dtype,
none for a decoded body already in it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from atroposlib.inference.weight_transfer import (
    BlockClaim,
    Staging,
    TransferError,
    stage_shared_memory,
)
from tests.fakes import trainer_block

EXPECTED = {"a": ((2, 3), torch.float32), "b": ((4,), torch.bfloat16)}


def test_a_shared_block_is_copied_once_into_the_served_dtypes() -> None:
    a, b = torch.arange(6.0).reshape(2, 3), torch.tensor([0.5, 1.5, -2.0, 3.0])
    raw = torch.cat([a.view(-1).view(torch.uint8), b.view(torch.uint8)])
    with trainer_block(raw.numel()) as block:
        torch.frombuffer(block.buf, dtype=torch.uint8, count=raw.numel()).copy_(raw)
        staging = Staging(EXPECTED)
        staged = stage_shared_memory(
            staging, block.name, ["a", "b"], ["float32", "float32"], [[2, 3], [4]]
        )
        assert staged == 2
        torch.frombuffer(block.buf, dtype=torch.uint8, count=raw.numel()).zero_()
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
    with (
        trainer_block(8) as block,
        pytest.raises(TransferError, match=r"update_info\.names"),
    ):
        stage_shared_memory(Staging(EXPECTED), block.name, [], [], [])


def stat_of(uid: int, mode: int, size: int) -> os.stat_result:
    """What ``os.fstat`` says of a block (only the fields the claim reads matter)."""
    return os.stat_result((stat.S_IFREG | mode, 0, 0, 1, uid, 0, size, 0, 0, 0))


@pytest.mark.parametrize(
    ("found", "needed", "named"),
    [
        (stat_of(os.geteuid() + 1, 0o600, 4096), 8, "belongs to another user"),
        (stat_of(os.geteuid(), 0o644, 4096), 8, "mode must be 0600"),
        (stat_of(os.geteuid(), 0o660, 4096), 8, "mode must be 0600"),
        (stat_of(os.geteuid(), 0o600, 8192), 8, "shm_bytes: is not the block's size"),
        (stat_of(os.geteuid(), 0o600, 4096), 4097, "more than shm_bytes"),
    ],
)
def test_a_block_that_is_not_what_the_caller_says_is_refused_without_its_size(
    found: os.stat_result, needed: int, named: str
) -> None:
    with pytest.raises(TransferError, match=named) as refused:
        BlockClaim("atropos_x_", 4096).check(found, needed)
    assert str(found.st_size) not in str(refused.value)  # the block's size is never told


def test_a_block_of_this_user_mode_0600_and_the_declared_size_is_used() -> None:
    a = torch.arange(6.0).reshape(2, 3)
    with trainer_block(24, name="atropos_x_ok") as block:
        torch.frombuffer(block.buf, dtype=torch.uint8, count=24).copy_(a.view(-1).view(torch.uint8))
        staging = Staging(EXPECTED)
        claim = BlockClaim("atropos_x_", 24)
        assert stage_shared_memory(staging, block.name, ["a"], ["float32"], [[2, 3]], claim) == 1
        assert torch.equal(staging.tensors["a"], a)
        with pytest.raises(TransferError, match="shm_prefix"):
            stage_shared_memory(
                staging, block.name, ["a"], ["float32"], [[2, 3]], BlockClaim("atropos_y_", 24)
            )
        os.fchmod(block._fd, 0o644)  # type: ignore[attr-defined]
        with pytest.raises(TransferError, match="0600"):
            stage_shared_memory(staging, block.name, ["a"], ["float32"], [[2, 3]], claim)
    assert staging.chunks == 1


def test_a_block_the_server_cannot_map_is_a_transfer_error() -> None:
    empty = Path("/dev/shm") / f"atropos_x_empty_{os.getpid()}"
    empty.touch(mode=0o600)  # zero bytes: mmap refuses it
    try:
        with pytest.raises(TransferError, match="cannot be opened"):
            stage_shared_memory(
                Staging(EXPECTED), empty.name, ["a"], ["float32"], [[2, 3]],
                BlockClaim("atropos_x_", 24),
            )  # fmt: skip
    finally:
        empty.unlink()
