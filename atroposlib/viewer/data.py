"""Groups for the viewer: from a live broker (read-only ``GET /recent_groups``) or dumps.

The broker reader only ever issues that one GET: a viewer can never register, pull batches
or reset a broker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from atroposlib.export.groups import parse_group, read_group_files
from atroposlib.wire.broker import RecentGroupsResponse

logger = logging.getLogger(__name__)

GroupLoader = Callable[[], list[dict[str, Any]]]


def broker_loader(
    api_url: str,
    api_key: str | None = None,
    limit: int = 64,
    http_get: Callable[..., httpx.Response] = httpx.get,
) -> GroupLoader:
    """A loader fetching the broker's last ``limit`` accepted groups (newest last)."""
    url = f"{api_url.rstrip('/')}/recent_groups"
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"

    def load() -> list[dict[str, Any]]:
        response = http_get(url, params={"limit": limit}, headers=headers, timeout=30)
        response.raise_for_status()
        answer = RecentGroupsResponse.model_validate(response.json())
        return [group.model_dump(mode="json") for group in answer.groups]

    return load


def file_loader(paths: Sequence[str]) -> GroupLoader:
    """A loader reading every group of the given JSONL dumps (re-read on each call)."""
    return lambda: list(read_group_files(paths))


def static_loader(groups: Sequence[dict[str, Any]]) -> GroupLoader:
    """A loader over groups already in memory (validated once)."""
    checked = [parse_group(group, where=f"group {index}") for index, group in enumerate(groups)]
    return lambda: list(checked)


def filter_groups(
    groups: Sequence[dict[str, Any]],
    env_id: int | None = None,
    min_score: float | None = None,
    max_score: float | None = None,
) -> list[int]:
    """Indices of the groups from ``env_id`` with at least one score in [min, max].

    >>> groups = [{"env_id": 0, "scores": [0.0, 1.0]}, {"env_id": 1, "scores": [0.2]}]
    >>> filter_groups(groups, min_score=0.5), filter_groups(groups, env_id=1)
    ([0], [1])
    """
    low = float("-inf") if min_score is None else min_score
    high = float("inf") if max_score is None else max_score
    return [
        index
        for index, group in enumerate(groups)
        if (env_id is None or group.get("env_id") == env_id)
        and any(low <= score <= high for score in group["scores"])
    ]


def env_ids(groups: Sequence[dict[str, Any]]) -> list[int]:
    return sorted({group["env_id"] for group in groups if group.get("env_id") is not None})
