"""atroposlib.api.utils: Atropos's packing functions over our packer (dict groups in and out)."""

from __future__ import annotations

import random
from itertools import combinations
from typing import Any

import pytest

from atroposlib.api.batching import EnvShare, FairShareState, QueuedGroupRef, form_batch
from atroposlib.api.utils import (
    find_groups_summing_to_target,
    grab_batch_with_minimum_allocations,
    grab_exact_from_heterogeneous_queue,
)


def group(size: int, env: int | None = None, tag: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"tokens": [[tag, i] for i in range(size)], "scores": [0.0] * size}
    if env is not None:
        out["env_id"] = env
    return out


def served(batch: list[dict[str, Any]]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for item in batch:
        counts[item["env_id"]] = counts.get(item["env_id"], 0) + len(item["tokens"])
    return counts


@pytest.mark.parametrize(
    ("sizes", "target", "expected"),
    [
        ([1, 2, 1], 4, [0, 1, 2]),
        ([2, 2, 4], 4, [0, 1]),
        ([3, 1, 4], 5, [1, 2]),  # the oldest group cannot be in any exact batch
        ([2, 4], 3, []),
        ([], 4, []),
        ([4, 2, 2, 4], 6, [0, 1]),
        ([3, 3, 2], 8, [0, 1, 2]),  # 2 does not divide 3: Atropos's packs never take it
        ([5, 1, 1, 3], 4, [1, 3]),
    ],
)
def test_find_groups_oldest_exact_subset(
    sizes: list[int], target: int, expected: list[int]
) -> None:
    buffer = [group(size) for size in sizes]
    assert find_groups_summing_to_target(buffer, target) == expected


def test_grab_exact_returns_the_batch_and_the_rest_in_order_without_touching_the_queue() -> None:
    queue = [group(3, tag=0), group(3, tag=1), group(2, tag=2), group(4, tag=3)]
    before = [dict(item) for item in queue]
    batch, rest = grab_exact_from_heterogeneous_queue(queue, 8)
    assert batch == [queue[0], queue[1], queue[2]]
    assert rest == [queue[3]]
    assert queue == before


def test_grab_exact_none_gives_back_the_same_queue() -> None:
    queue = [group(2), group(4)]
    batch, rest = grab_exact_from_heterogeneous_queue(queue, 3)
    assert batch is None and rest is queue
    assert grab_exact_from_heterogeneous_queue([], 4) == (None, [])


def test_grab_exact_finds_a_batch_whenever_one_exists() -> None:
    rng = random.Random(7)
    for _ in range(300):
        sizes = [rng.choice([1, 2, 3, 4, 6, 8]) for _ in range(rng.randint(1, 9))]
        target = rng.randint(1, 20)
        possible = any(
            sum(subset) == target
            for r in range(1, len(sizes) + 1)
            for subset in combinations(sizes, r)
        )
        batch, rest = grab_exact_from_heterogeneous_queue([group(s) for s in sizes], target)
        assert (batch is not None) == possible, (sizes, target)
        if batch is not None:
            assert sum(len(item["tokens"]) for item in batch) == target
            assert len(batch) + len(rest) == len(sizes)


@pytest.mark.parametrize(
    ("queue", "message"),
    [
        ([{"tokens": []}], r"queue\[0\]\.tokens must be a non-empty list"),
        ([group(1), {"scores": [1.0]}], r"queue\[1\]\.tokens"),
    ],
)
def test_groups_without_sequences_are_refused_naming_the_index(
    queue: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        find_groups_summing_to_target(queue, 1)


def test_bad_sizes_and_configs_are_refused() -> None:
    with pytest.raises(ValueError, match="target_size must be >= 1"):
        find_groups_summing_to_target([group(1)], 0)
    with pytest.raises(ValueError, match=r"env_configs\[0\] has no 'registered_id'"):
        grab_batch_with_minimum_allocations([group(1, env=0)], 1, [{"connected": True}])
    bad = [{"registered_id": 0, "connected": True, "min_batch_allocation": -0.5}]
    with pytest.raises(ValueError, match=r"env_configs\[0\]\.min_batch_allocation"):
        grab_batch_with_minimum_allocations([group(1, env=0)], 1, bad)


def env(env_id: int, minimum: float | None, connected: bool = True, **extra: Any) -> dict:
    return {"registered_id": env_id, "connected": connected, "min_batch_allocation": minimum,
            **extra}  # fmt: skip


def test_minimums_are_honoured() -> None:
    queue = [group(2, env=0, tag=i) for i in range(6)] + [group(2, env=1, tag=9)] * 3
    batch, rest = grab_batch_with_minimum_allocations(queue, 8, [env(0, None), env(1, 0.75)])
    assert batch is not None
    assert served(batch) == {0: 2, 1: 6}
    assert len(rest) == len(queue) - len(batch)


def test_minimums_over_one_are_scaled_down() -> None:
    queue = [group(1, env=0)] * 4 + [group(1, env=1)] * 4
    batch, _ = grab_batch_with_minimum_allocations(queue, 4, [env(0, 0.9), env(1, 0.9)])
    assert batch is not None and served(batch) == {0: 2, 1: 2}
    batch, _ = grab_batch_with_minimum_allocations(queue[:4], 4, [env(0, 1.5)])
    assert batch is not None and served(batch) == {0: 4}


def test_an_env_owed_a_minimum_without_data_holds_the_batch() -> None:
    """Atropos's contract for this function; the broker itself never stalls (see below)."""
    queue = [group(2, env=1)] * 5
    configs = [env(0, 0.5), env(1, None)]
    assert grab_batch_with_minimum_allocations(queue, 4, configs) == (None, queue)
    configs[0]["connected"] = False  # a disconnected env's minimum is not owed
    batch, _ = grab_batch_with_minimum_allocations(queue, 4, configs)
    assert batch is not None and served(batch) == {1: 4}
    configs = [env(0, 0.1), env(1, None)]  # 10 % of 4 rounds to no sequence at all
    batch, _ = grab_batch_with_minimum_allocations(queue, 4, configs)
    assert batch is not None


def test_an_env_owed_a_minimum_needs_a_complete_pack() -> None:
    """Three groups of 2 cannot fill a pack of the largest group (8): Atropos waits."""
    queue = [group(2, env=0)] * 3 + [group(8, env=1)] * 2
    assert grab_batch_with_minimum_allocations(queue, 8, [env(0, 0.25), env(1, None)])[0] is None
    queue.append(group(2, env=0))
    batch, _ = grab_batch_with_minimum_allocations(queue, 16, [env(0, 0.25), env(1, None)])
    assert batch is not None and served(batch) == {0: 8, 1: 8}


def test_a_minimum_no_exact_batch_allows_gives_none_where_the_broker_relaxes_it() -> None:
    queue = [group(3, env=0), group(4, env=1)]
    configs = [env(0, 0.25), env(1, None)]
    assert grab_batch_with_minimum_allocations(queue, 4, configs)[0] is None
    refs = [QueuedGroupRef(key=0, env_id=0, size=3), QueuedGroupRef(key=1, env_id=1, size=4)]
    shares = {0: EnvShare(min_allocation=0.25), 1: EnvShare()}
    assert form_batch(refs, 4, shares, FairShareState()) == [1]


def test_the_rest_of_the_batch_follows_the_env_weights() -> None:
    queue = [group(1, env=0, tag=i) for i in range(8)] + [group(1, env=1, tag=i) for i in range(8)]
    configs = [env(0, 0.25, weight=1.0), env(1, None, weight=3.0)]
    batch, _ = grab_batch_with_minimum_allocations(queue, 8, configs)
    assert batch is not None and served(batch) == {0: 2, 1: 6}


def test_without_minimums_it_is_grab_exact() -> None:
    queue = [group(1, env=i % 2, tag=i) for i in range(6)]
    configs = [env(0, None), env(1, None, weight=5.0)]
    assert grab_batch_with_minimum_allocations(queue, 4, configs) == (
        grab_exact_from_heterogeneous_queue(queue, 4)
    )
    assert grab_batch_with_minimum_allocations([], 4, configs) == (None, [])
