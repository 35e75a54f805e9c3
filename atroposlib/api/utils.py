"""Atropos 0.4's batch-packing functions (``atroposlib.api.utils``), over our packer.

Queued groups are dicts whose ``tokens`` holds one row per sequence (``env_id`` optional).
The functions are pure: the queue passed in is never changed; a batch comes back with the
rest of the queue, or ``(None, queue)`` when no batch can be formed now. Our broker does not
call them; it runs :func:`atroposlib.api.batching.form_batch` on its store directly.

Two differences from Atropos's functions, both from the packer:

- every subset of the queue that sums to the batch size is found. Atropos first bundles each
  group size into packs as large as the largest group and never takes a size that does not
  divide it;
- among the exact batches, the oldest groups are taken first.

``grab_batch_with_minimum_allocations`` keeps Atropos's contract that a minimum share is a
hard requirement of *this function*: it answers ``None`` while a connected env with a minimum
cannot be given it, including while that env holds no complete pack (groups of one size whose
sequences add up to the largest group queued), as Atropos's does. The broker treats minimums
as a preference that never stalls the queue (COMPAT.md).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from atroposlib.api.batching import EnvShare, FairShareState, QueuedGroupRef, form_batch

__all__ = [
    "find_groups_summing_to_target",
    "grab_batch_with_minimum_allocations",
    "grab_exact_from_heterogeneous_queue",
]

Group = TypeVar("Group", bound=Mapping[str, Any])


def find_groups_summing_to_target(
    buffer: Sequence[Mapping[str, Any]], target_size: int
) -> list[int]:
    """Indices (ascending) of groups whose sequence counts sum to exactly ``target_size``,
    preferring the oldest; ``[]`` when no subset does.

    >>> find_groups_summing_to_target([{"tokens": [[1]] * 3}, {"tokens": [[2]]},
    ...                                {"tokens": [[3]] * 4}], 5)
    [1, 2]
    """
    if target_size < 1:
        raise ValueError(f"target_size must be >= 1, got {target_size}")
    return _exact_batch(buffer, target_size, env_ids=None, shares={}) or []


def grab_exact_from_heterogeneous_queue(
    queue: list[Group], batch_size: int
) -> tuple[list[Group] | None, list[Group]]:
    """A batch of whole groups holding exactly ``batch_size`` sequences, oldest first, and the
    queue without them; ``(None, queue)`` when no subset of the queue sums to ``batch_size``."""
    indices = find_groups_summing_to_target(queue, batch_size)
    if not indices:
        return None, queue
    return _split(queue, indices)


def grab_batch_with_minimum_allocations(
    queue: list[Group], batch_size: int, env_configs: Sequence[Mapping[str, Any]]
) -> tuple[list[Group] | None, list[Group]]:
    """Like :func:`grab_exact_from_heterogeneous_queue`, giving each connected env with a
    ``min_batch_allocation`` at least ``floor(min * batch_size)`` sequences.

    Minimums adding up to more than 1 are scaled down in proportion. An env config is a dict
    with ``registered_id``, ``connected`` and optionally ``min_batch_allocation`` and
    ``weight`` (how the rest of the batch is shared; default 1). ``(None, queue)`` when no
    exact batch honours every minimum (see the module docstring).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    minimums, weights = _read_env_configs(env_configs)
    if not queue:
        return None, queue
    if not minimums:
        return grab_exact_from_heterogeneous_queue(queue, batch_size)
    total = sum(minimums.values())
    if total > 1.0:
        minimums = {env: share / total for env, share in minimums.items()}
    reserved = {env: _reserved(share, batch_size) for env, share in minimums.items()}
    reserved = {env: amount for env, amount in reserved.items() if amount > 0}
    env_ids = [group.get("env_id") for group in queue]
    sizes = [_size(group, position) for position, group in enumerate(queue)]
    if not all(_holds_complete_pack(env, env_ids, sizes) for env in reserved):
        return None, queue
    shares = {
        env: EnvShare(weight=weights.get(env, 1.0), min_allocation=minimums.get(env))
        for env in set(env_ids) | set(weights)
    }
    indices = _exact_batch(queue, batch_size, env_ids=env_ids, shares=shares)
    if indices is None:
        return None, queue
    served = Counter(env_ids[i] for i in indices for _ in range(sizes[i]))
    if any(served[env] < amount for env, amount in reserved.items()):
        return None, queue  # the packer relaxes a minimum no exact batch allows; we may not
    return _split(queue, indices)


def _read_env_configs(
    env_configs: Sequence[Mapping[str, Any]],
) -> tuple[dict[Any, float], dict[Any, float]]:
    """(minimum share of each connected env that has one, weight of each env that has one)."""
    minimums: dict[Any, float] = {}
    weights: dict[Any, float] = {}
    for position, config in enumerate(env_configs):
        if "registered_id" not in config:
            raise ValueError(f"env_configs[{position}] has no 'registered_id'")
        env = config["registered_id"]
        if config.get("weight") is not None:
            weights[env] = float(config["weight"])
        share = config.get("min_batch_allocation")
        if share is None or not config.get("connected", False):
            continue
        share = float(share)
        if not (math.isfinite(share) and share >= 0):
            raise ValueError(
                f"env_configs[{position}].min_batch_allocation must be a number >= 0, "
                f"got {config['min_batch_allocation']!r}"
            )
        minimums[env] = share
    return minimums, weights


def _reserved(share: float, batch_size: int) -> int:
    """Sequences a minimum share reserves (the packer's own rounding)."""
    return math.floor(share * batch_size + 1e-9)


def _holds_complete_pack(env: Any, env_ids: list[Any], sizes: list[int]) -> bool:
    """Whether ``env`` has groups of one size that together hold the largest group's count."""
    largest = max(sizes)
    counts = Counter(size for owner, size in zip(env_ids, sizes, strict=True) if owner == env)
    return any(largest % size == 0 and count * size >= largest for size, count in counts.items())


def _size(group: Mapping[str, Any], position: int) -> int:
    tokens = group.get("tokens")
    if not isinstance(tokens, Sequence) or isinstance(tokens, str | bytes) or not tokens:
        raise ValueError(f"queue[{position}].tokens must be a non-empty list of sequences")
    return len(tokens)


def _exact_batch(
    queue: Sequence[Mapping[str, Any]],
    batch_size: int,
    env_ids: list[Any] | None,
    shares: Mapping[Any, EnvShare],
) -> list[int] | None:
    """Indices of the packer's batch (ascending), or None; one env for all when no env_ids."""
    if not queue:
        return None
    refs = [
        QueuedGroupRef(key=i, env_id=None if env_ids is None else env_ids[i], size=_size(g, i))
        for i, g in enumerate(queue)
    ]
    return form_batch(refs, batch_size, shares, FairShareState())


def _split(queue: list[Group], indices: list[int]) -> tuple[list[Group], list[Group]]:
    chosen = set(indices)
    return [queue[i] for i in indices], [g for i, g in enumerate(queue) if i not in chosen]
