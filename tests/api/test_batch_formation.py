"""The pure batch packer: exact batches, no stalls, weighted shares, minimums, FIFO."""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import combinations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atroposlib.api.batching import (
    EnvShare,
    FairShareState,
    QueuedGroupRef,
    SizePool,
    _sumset,
    form_batch,
    reach,
)

EnvKey = int | None


def make_queue(groups: Iterable[tuple[EnvKey, int]], first_key: int = 0) -> list[QueuedGroupRef]:
    return [
        QueuedGroupRef(key=first_key + i, env_id=env, size=size)
        for i, (env, size) in enumerate(groups)
    ]


def sizes_by_env(queue: Sequence[QueuedGroupRef], keys: Iterable[int]) -> Counter[EnvKey]:
    by_key = {group.key: group for group in queue}
    served: Counter[EnvKey] = Counter()
    for key in keys:
        served[by_key[key].env_id] += by_key[key].size
    return served


def exact_subsets(queue: Sequence[QueuedGroupRef], batch_size: int) -> list[list[QueuedGroupRef]]:
    """Every subset of the queue summing to batch_size (brute force, small queues only)."""
    return [
        list(subset)
        for n in range(1, len(queue) + 1)
        for subset in combinations(queue, n)
        if sum(group.size for group in subset) == batch_size
    ]


def subset_sums(sizes: Iterable[int]) -> set[int]:
    """Every sum some sub-multiset of `sizes` makes (plain set DP, the oracle for bitsets)."""
    sums = {0}
    for size in sizes:
        sums |= {total + size for total in sums}
    return sums


def reserved_of(share: EnvShare, batch_size: int) -> int:
    return int((share.min_allocation or 0.0) * batch_size + 1e-9)


# ---- table-driven cases


@pytest.mark.parametrize(
    ("groups", "batch_size", "expected_keys"),
    [
        pytest.param([(0, 3), (0, 2), (0, 2)], 4, [1, 2], id="3+2+2 for 4 takes the two 2s"),
        pytest.param([(0, 8), (0, 6), (0, 6)], 12, [1, 2], id="size not dividing 8 is packed"),
        pytest.param([(0, 4), (0, 3), (0, 3), (0, 5)], 6, [1, 2], id="3+3 when 4 and 5 cannot"),
        pytest.param([(0, 5), (0, 3), (0, 1), (0, 3)], 7, [1, 2, 3], id="skip 5, 3+1+3"),
        pytest.param([(0, 2), (0, 2), (0, 2), (0, 2)], 4, [0, 1], id="fifo: oldest two"),
        pytest.param([(0, 4)], 4, [0], id="one group fills the batch"),
        pytest.param([(None, 2), (None, 2)], 4, [0, 1], id="unregistered sender"),
        pytest.param([(0, 3), (0, 3)], 4, None, id="no exact subset"),
        pytest.param([(0, 9), (0, 2)], 8, None, id="oversized group never fits"),
        pytest.param([], 4, None, id="empty queue"),
    ],
)
def test_form_batch_table(
    groups: list[tuple[EnvKey, int]], batch_size: int, expected_keys: list[int] | None
) -> None:
    state = FairShareState()
    assert form_batch(make_queue(groups), batch_size, {}, state) == expected_keys
    if expected_keys is None:
        assert state.virtual_time == {}


def test_atropos_stranding_case_drains_every_size() -> None:
    # Atropos packed in units of the largest group size, so groups of 3 behind groups of 8 never
    # left the queue. Here every group leaves once the queue holds enough for exact batches.
    queue = make_queue([(0, 8)] * 4 + [(1, 3)] * 8 + [(2, 2)] * 4)
    state = FairShareState()
    delivered: list[int] = []
    while (batch := form_batch(queue, 16, {}, state)) is not None:
        assert sum(group.size for group in queue if group.key in batch) == 16
        delivered += batch
        queue = [group for group in queue if group.key not in batch]
    assert queue == []
    assert sorted(delivered) == list(range(16))


def test_long_queue_where_only_one_env_can_finish_the_batch() -> None:
    # 1023 = 15 + 63 * 16 or 17 * 15 + 48 * 16: once the 16s cannot finish the batch, seven
    # envs hold nothing usable; they are dropped without walking their whole queues.
    queue = make_queue((env, 15 if env == 0 else 16) for env in list(range(8)) * 500)
    state = FairShareState()
    for _ in range(3):
        batch = form_batch(queue, 1023, {}, state)
        assert batch is not None
        chosen = [group for group in queue if group.key in batch]
        assert sum(group.size for group in chosen) == 1023
        fifteens = [group.key for group in queue if group.size == 15]
        picked = [group.key for group in chosen if group.size == 15]
        assert picked == fifteens[: len(picked)]
        assert len(picked) % 16 == 1
        queue = [group for group in queue if group.key not in batch]


def test_minimum_share_is_honoured_when_the_env_has_data() -> None:
    queue = make_queue([(0, 2)] * 20 + [(1, 2)] * 4)
    shares = {0: EnvShare(weight=9.0), 1: EnvShare(min_allocation=0.5)}
    batch = form_batch(queue, 8, shares, FairShareState())
    assert batch is not None
    assert sizes_by_env(queue, batch)[1] == 4


def test_minimum_share_does_not_stall_without_data() -> None:
    queue = make_queue([(0, 2)] * 8)
    shares = {1: EnvShare(min_allocation=0.5), 2: EnvShare(weight=5.0, min_allocation=0.25)}
    batch = form_batch(queue, 8, shares, FairShareState())
    assert batch == [0, 1, 2, 3]


def test_minimum_share_takes_what_exactness_allows() -> None:
    # env 1 wants 6 of 8, but with its 3 and 4 and env 0's 2s only 0 or 4 of it fit exactly.
    queue = make_queue([(0, 2)] * 4 + [(1, 3), (1, 4)])
    shares = {0: EnvShare(weight=9.0), 1: EnvShare(min_allocation=0.75)}
    assert form_batch(queue, 8, shares, FairShareState()) == [0, 1, 5]


def test_minimum_share_takes_oldest_groups_that_sum_exactly() -> None:
    # env 1 is far behind in virtual time, so fair share alone would give env 0 the batch.
    # Its reservation of 2 is met by its oldest groups that sum to exactly 2: the two 1s.
    queue = make_queue([(1, 1), (1, 2), (1, 1), (0, 2), (0, 2)])
    shares = {1: EnvShare(min_allocation=0.5)}
    state = FairShareState({0: 0.0, 1: 50.0})
    assert form_batch(queue, 4, shares, state) == [0, 2, 3]
    assert form_batch(queue, 4, {}, FairShareState({0: 0.0, 1: 50.0})) == [3, 4]


def test_unregistered_sender_has_its_own_bucket_in_state() -> None:
    queue = make_queue([(None, 2), (0, 2), (None, 2), (0, 2)])
    state = FairShareState()
    batch = form_batch(queue, 4, {}, state)
    assert batch == [0, 1]
    assert set(state.virtual_time) == {None, 0}
    assert "none" in state.to_dict()


def test_fifo_within_env_and_sorted_keys() -> None:
    queue = make_queue([(1, 2), (0, 2), (1, 2), (0, 2), (1, 2), (0, 2)])
    batch = form_batch(queue, 8, {}, FairShareState())
    assert batch == [0, 1, 2, 3]


def test_weights_three_to_one_over_400_batches() -> None:
    rng = random.Random(7)
    shares = {0: EnvShare(weight=3.0), 1: EnvShare(weight=1.0)}
    state = FairShareState()
    queue: list[QueuedGroupRef] = []
    next_key = 0
    served: Counter[EnvKey] = Counter()
    for _ in range(400):
        for env in (0, 1):
            while sum(group.size for group in queue if group.env_id == env) < 64:
                queue.append(QueuedGroupRef(next_key, env, rng.choice([2, 4, 8])))
                next_key += 1
        batch = form_batch(queue, 32, shares, state)
        assert batch is not None
        served += sizes_by_env(queue, batch)
        chosen = set(batch)
        queue = [group for group in queue if group.key not in chosen]
    share_of_env0 = served[0] / (served[0] + served[1])
    assert share_of_env0 == pytest.approx(0.75, abs=0.05)


def test_idle_env_banks_no_credit() -> None:
    state = FairShareState()
    keys = itertools.count()
    # both envs are served, then env 1 alone for 50 batches while env 0 has no data...
    queue = [QueuedGroupRef(next(keys), env, 4) for env in (0, 1) * 2]
    assert form_batch(queue, 8, {}, state) is not None
    for _ in range(50):
        queue = [QueuedGroupRef(next(keys), 1, 4) for _ in range(2)]
        assert form_batch(queue, 8, {}, state) is not None
    # ...then both are backlogged: env 0 must not take every batch to catch up.
    queue = [QueuedGroupRef(next(keys), env, 4) for env in (0, 1) * 20]
    served: Counter[EnvKey] = Counter()
    for _ in range(4):
        batch = form_batch(queue, 8, {}, state)
        assert batch is not None
        served += sizes_by_env(queue, batch)
        queue = [group for group in queue if group.key not in batch]
    assert served[0] == served[1] == 16


def test_state_untouched_when_no_batch() -> None:
    state = FairShareState({0: 1.5, None: 0.0})
    assert form_batch(make_queue([(0, 3)]), 4, {}, state) is None
    assert state.virtual_time == {0: 1.5, None: 0.0}


def test_state_round_trip_through_json() -> None:
    state = FairShareState({None: 0.25, 0: 0.0, 17: 3.5})
    restored = FairShareState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state


@pytest.mark.parametrize(
    "bad", [{"weight": 0.0}, {"weight": -1.0}, {"weight": float("nan")}, {"min_allocation": 1.5}]
)
def test_env_share_rejects_bad_values(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        EnvShare(**bad)


def test_bad_batch_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        form_batch(make_queue([(0, 1)]), 0, {}, FairShareState())


# ---- properties

ENVS: list[EnvKey] = [None, 0, 1, 2]
queues = st.lists(st.tuples(st.sampled_from(ENVS), st.integers(1, 8)), max_size=11)
share_maps = st.dictionaries(
    st.sampled_from(ENVS),
    st.builds(
        EnvShare,
        weight=st.sampled_from([0.5, 1.0, 2.0, 3.0]),
        min_allocation=st.one_of(st.none(), st.sampled_from([0.1, 0.25, 0.5, 0.75, 1.0])),
    ),
    max_size=4,
)
PROPERTY_SETTINGS = settings(
    max_examples=200, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY_SETTINGS
@given(groups=queues, batch_size=st.integers(1, 12), shares=share_maps)
def test_draining_delivers_exact_batches_once_and_strands_nothing(
    groups: list[tuple[EnvKey, int]], batch_size: int, shares: dict[EnvKey, EnvShare]
) -> None:
    queue = make_queue(groups)
    state = FairShareState()
    delivered: set[int] = set()
    while (batch := form_batch(queue, batch_size, shares, state)) is not None:
        assert batch == sorted(set(batch))
        assert delivered.isdisjoint(batch)
        assert sum(group.size for group in queue if group.key in batch) == batch_size
        assert set(batch) <= {group.key for group in queue}
        delivered.update(batch)
        queue = [group for group in queue if group.key not in batch]
        json.dumps(state.to_dict())
    assert batch_size not in subset_sums(group.size for group in queue)


@PROPERTY_SETTINGS
@given(
    groups=st.lists(st.tuples(st.sampled_from(ENVS), st.integers(1, 6)), max_size=60),
    batch_size=st.integers(1, 24),
    shares=share_maps,
)
def test_draining_long_queues_strands_nothing(
    groups: list[tuple[EnvKey, int]], batch_size: int, shares: dict[EnvKey, EnvShare]
) -> None:
    # Long queues of small groups exceed batch_size // size per size, so the capped counts and
    # the reachability caches are exercised.
    queue = make_queue(groups)
    state = FairShareState()
    delivered = 0
    while (batch := form_batch(queue, batch_size, shares, state)) is not None:
        assert sum(group.size for group in queue if group.key in batch) == batch_size
        delivered += len(batch)
        queue = [group for group in queue if group.key not in batch]
    assert delivered + len(queue) == len(groups)
    assert batch_size not in subset_sums(group.size for group in queue)


@PROPERTY_SETTINGS
@given(
    groups=queues,
    batch_size=st.integers(1, 12),
    shares=share_maps,
    old_times=st.dictionaries(st.sampled_from(ENVS), st.floats(0, 50), max_size=4),
)
def test_minimums_honoured_when_some_exact_batch_honours_them(
    groups: list[tuple[EnvKey, int]],
    batch_size: int,
    shares: dict[EnvKey, EnvShare],
    old_times: dict[EnvKey, float],
) -> None:
    queue = make_queue(groups)
    state = FairShareState(dict(old_times))
    batch = form_batch(queue, batch_size, shares, state)
    candidates = exact_subsets(queue, batch_size)
    assert (batch is None) == (candidates == [])
    if batch is None:
        assert state.virtual_time == old_times
        return
    present = {group.env_id for group in queue}
    reserved = {
        env: reserved_of(share, batch_size) for env, share in shares.items() if env in present
    }

    def honours(keys: Iterable[int]) -> bool:
        served = sizes_by_env(queue, keys)
        return all(served[env] >= need for env, need in reserved.items())

    if any(honours(group.key for group in subset) for subset in candidates):
        assert honours(batch)
    for env, need in reserved.items():
        alone_feasible = any(
            sum(g.size for g in subset if g.env_id == env) >= need for subset in candidates
        )
        if alone_feasible and len(reserved) == 1:
            assert sizes_by_env(queue, batch)[env] >= need


@settings(max_examples=20, derandomize=True, deadline=None)
@given(
    weights=st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0, 5.0]), min_size=3, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_backlogged_envs_share_sequences_by_weight(weights: list[float], seed: int) -> None:
    rng = random.Random(seed)
    envs: list[EnvKey] = [None, 0, 1]
    shares = {env: EnvShare(weight=weight) for env, weight in zip(envs, weights, strict=True)}
    state = FairShareState()
    queue: list[QueuedGroupRef] = []
    keys = itertools.count()
    served: Counter[EnvKey] = Counter()
    for _ in range(100):
        for env in envs:
            while sum(group.size for group in queue if group.env_id == env) < 32:
                queue.append(QueuedGroupRef(next(keys), env, rng.choice([1, 2, 4])))
        batch = form_batch(queue, 16, shares, state)
        assert batch is not None
        served += sizes_by_env(queue, batch)
        queue = [group for group in queue if group.key not in batch]
    for env, weight in zip(envs, weights, strict=True):
        assert served[env] / 1600 == pytest.approx(weight / sum(weights), abs=0.02)


@PROPERTY_SETTINGS
@given(groups=queues, batch_size=st.integers(1, 12), shares=share_maps)
def test_fifo_within_env_per_size(
    groups: list[tuple[EnvKey, int]], batch_size: int, shares: dict[EnvKey, EnvShare]
) -> None:
    # Equal-size groups of one env are interchangeable, so the chosen ones are always the oldest.
    queue = make_queue(groups)
    batch = form_batch(queue, batch_size, shares, FairShareState())
    if batch is None:
        return
    chosen = set(batch)
    for env in ENVS:
        for size in range(1, 9):
            same = [g.key for g in queue if g.env_id == env and g.size == size]
            picked = [key in chosen for key in same]
            assert picked == sorted(picked, reverse=True)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    times=st.dictionaries(
        st.one_of(st.none(), st.integers(-(2**40), 2**40)),
        st.floats(allow_nan=False, allow_infinity=False),
        max_size=6,
    )
)
def test_state_serialises_round_trip(times: dict[EnvKey, float]) -> None:
    state = FairShareState(times)
    encoded = json.loads(json.dumps(state.to_dict()))
    assert all(isinstance(name, str) for name in encoded)
    assert FairShareState.from_dict(encoded) == state


# ---- the bitset helpers against plain set arithmetic

size_counts = st.dictionaries(st.integers(1, 10), st.integers(0, 6), max_size=5)


def bits_of(values: Iterable[int]) -> int:
    return sum(1 << value for value in set(values))


@settings(max_examples=200, derandomize=True, deadline=None)
@given(counts=size_counts, limit=st.integers(1, 40))
def test_reach_is_every_subset_sum_up_to_limit(counts: dict[int, int], limit: int) -> None:
    sums = subset_sums(size for size, count in counts.items() for _ in range(count))
    assert reach(counts, limit) == bits_of(total for total in sums if total <= limit)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    counts=size_counts,
    limit=st.integers(1, 40),
    picks=st.lists(st.integers(1, 10), max_size=6),
)
def test_size_pool_can_take_matches_subset_sums(
    counts: dict[int, int], limit: int, picks: list[int]
) -> None:
    pool = SizePool(counts, limit)
    left = Counter({size: count for size, count in counts.items() if count})
    for size in [*picks, 0]:  # interleave takes with queries so the caches are invalidated too
        for candidate in range(1, 11):
            sums = subset_sums((left - Counter({candidate: 1})).elements())
            for target in range(limit + 1):
                expected = left[candidate] > 0 and target - candidate in sums
                assert pool.can_take(candidate, target) == expected, (candidate, target)
        if left[size]:
            pool.take(size)
            left[size] -= 1


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    left=st.sets(st.integers(0, 30), max_size=20),
    right=st.sets(st.integers(0, 30), max_size=20),
    limit=st.integers(0, 40),
)
def test_sumset_is_pairwise_sums(left: set[int], right: set[int], limit: int) -> None:
    expected = bits_of(a + b for a in left for b in right if a + b <= limit)
    assert _sumset(bits_of(left), bits_of(right), (1 << (limit + 1)) - 1) == expected
