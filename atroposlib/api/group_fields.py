"""Fast checks of a group's declared per-sequence fields and override keys (no pydantic).

The rules are :mod:`atroposlib.group`'s: ``finish_reasons``, ``policy_versions`` and ``extra``
hold one entry per sequence; the declared ``overrides`` / ``group_overrides`` keys have their
declared types (undeclared keys pass through, as Atropos allowed). ``token_policy_versions``
rows are checked with the other per-token integer rows in :mod:`atroposlib.api.validation`.
"""

from __future__ import annotations

import math
from typing import Any, get_args

from atroposlib.bounds import MAX_STEP
from atroposlib.errors import InvalidGroupError
from atroposlib.group import FinishReason

FINISH_REASONS = frozenset(get_args(FinishReason))
_BOOL_KEYS = ("set_advantage_to_zero", "sft", "truncated")


def _per_sequence(raw: dict[str, Any], field: str, size: int) -> list[Any] | None:
    rows = raw.get(field)
    if rows is None:
        return None
    if not isinstance(rows, list) or len(rows) != size:
        count = len(rows) if isinstance(rows, list) else "no"
        raise InvalidGroupError(
            field, f"has {count} entries but tokens has {size} sequences; send one per sequence"
        )
    return rows


def _check_temperature(field: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidGroupError(field, "must be a number > 0")
    if not math.isfinite(value) or value <= 0:
        raise InvalidGroupError(field, "must be a finite number > 0")


def _check_flags(field: str, values: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        if values.get(key) is not None and not isinstance(values[key], bool):
            raise InvalidGroupError(f"{field}.{key}", "must be true, false or null")


def check_overrides(raw: dict[str, Any], size: int) -> None:
    overrides = _per_sequence(raw, "overrides", size)
    for index, entry in enumerate(overrides or ()):
        field = f"overrides[{index}]"
        if not isinstance(entry, dict):
            raise InvalidGroupError("overrides", "must be a list of objects, one per sequence")
        _check_flags(field, entry, _BOOL_KEYS)
        _check_temperature(f"{field}.temperature", entry.get("temperature"))
        if entry.get("role") is not None and not isinstance(entry["role"], str):
            raise InvalidGroupError(f"{field}.role", "must be a string or null")
    shared = raw.get("group_overrides")
    if shared is None:
        return
    if not isinstance(shared, dict):
        raise InvalidGroupError("group_overrides", "must be an object or null")
    _check_flags("group_overrides", shared, ("sft",))
    _check_temperature("group_overrides.temperature", shared.get("temperature"))
    group_size = shared.get("group_size")
    if group_size is not None and (
        isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1
    ):
        raise InvalidGroupError("group_overrides.group_size", "must be an integer >= 1 or null")


def check_sequence_fields(raw: dict[str, Any], size: int) -> None:
    """``finish_reasons``, ``policy_versions``, ``extra``, ``messages`` and the overrides."""
    for index, reason in enumerate(_per_sequence(raw, "finish_reasons", size) or ()):
        if reason is not None and (not isinstance(reason, str) or reason not in FINISH_REASONS):
            raise InvalidGroupError(
                f"finish_reasons[{index}]", f"must be one of {sorted(FINISH_REASONS)} or null"
            )
    for index, version in enumerate(_per_sequence(raw, "policy_versions", size) or ()):
        if version is not None and (
            isinstance(version, bool)
            or not isinstance(version, int)
            or not 0 <= version <= MAX_STEP
        ):
            raise InvalidGroupError(
                f"policy_versions[{index}]", f"must be an integer between 0 and {MAX_STEP} or null"
            )
    for index, entry in enumerate(_per_sequence(raw, "extra", size) or ()):
        if not isinstance(entry, dict):
            raise InvalidGroupError(f"extra[{index}]", "must be a JSON object")
    _per_sequence(raw, "messages", size)
    check_overrides(raw, size)
