"""Fast checks of one decoded group (a dict from JSON or msgpack), with numpy, no pydantic.

The rules are those of :class:`atroposlib.group.ScoredData` plus what a trainer needs:
aligned lengths, finite numbers, at least one sequence, token ids and masks that are numbers
(not numeric strings) within int32; true/false count as 1/0, as the protocol model takes
them. A failure raises :class:`InvalidGroupError` naming the field and the fix. The result
holds the per-token fields as 1-D numpy arrays (int32 / float32), ready for the store.
"""

from __future__ import annotations

import array
import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from atroposlib.api.group_fields import check_sequence_fields
from atroposlib.bounds import MAX_STEP
from atroposlib.codec import PACKED_DTYPES
from atroposlib.errors import InvalidGroupError
from atroposlib.group import SCORED_DATA_FIELDS
from atroposlib.wire.broker import PACKED_FLOAT_FIELDS, PACKED_INT_FIELDS

logger = logging.getLogger(__name__)

_INT32 = np.iinfo(np.int32)
_GROUP_ID_MAX = 200
_DICT_OR_NONE = ("generation_params",)
_OPTIONAL_INT_ROWS = tuple(f for f in PACKED_INT_FIELDS if f not in ("tokens", "masks"))
_NESTED_OR_NONE = ("distill_token_ids", "distill_logprobs")


@dataclass(slots=True)
class CheckedGroup:
    group: dict[str, Any]
    size: int
    tokens: int
    max_len: int
    env_id: int | None
    group_id: str | None
    policy_version: int | None


def _integral_int32(arr: np.ndarray) -> bool:
    finite = bool(np.isfinite(arr).all())
    return finite and bool((arr == arr.round()).all()) and _in_int32(arr)


def _in_int32(arr: np.ndarray) -> bool:
    return bool(arr.min() >= _INT32.min and arr.max() <= _INT32.max)


def _int_row(field: str, index: int, row: Any) -> np.ndarray:
    dtype = PACKED_DTYPES[field]
    if isinstance(row, np.ndarray) and row.dtype == dtype and row.ndim == 1:
        return row  # decoded straight into int32 (atroposlib.api.fastjson): nothing to check
    if isinstance(row, bytes | bytearray | memoryview):
        if len(row) % 4:
            raise InvalidGroupError(
                f"{field}[{index}]", "packed bytes must be little-endian int32 (length % 4 == 0)"
            )
        return np.frombuffer(row, dtype=PACKED_DTYPES[field])
    if not isinstance(row, list | np.ndarray):
        raise InvalidGroupError(f"{field}[{index}]", "must be a list of integers")
    if isinstance(row, list):
        try:  # C loop: rejects floats, strings, None and values outside int32 by itself
            return np.frombuffer(array.array("i", row), dtype=PACKED_DTYPES[field])
        except (TypeError, OverflowError):
            pass  # e.g. 5.0 or 2**40: the slower checks below accept or name the problem
    try:
        arr = np.asarray(row)
    except (ValueError, TypeError, OverflowError) as err:
        raise InvalidGroupError(f"{field}[{index}]", f"must be a list of integers ({err})") from err
    if arr.ndim != 1:
        raise InvalidGroupError(f"{field}[{index}]", "must be a flat list of integers")
    if arr.size and arr.dtype.kind == "f" and _integral_int32(arr):
        arr = arr.astype(np.int64)
    if arr.size and arr.dtype.kind not in "iu":
        raise InvalidGroupError(f"{field}[{index}]", "must be a list of integers")
    if arr.size and not _in_int32(arr):
        raise InvalidGroupError(f"{field}[{index}]", "values must fit in int32")
    return arr.astype(PACKED_DTYPES[field], copy=False)


def _float_row(field: str, index: int, row: Any) -> np.ndarray:
    if isinstance(row, bytes | bytearray | memoryview):
        if len(row) % 4:
            raise InvalidGroupError(
                f"{field}[{index}]", "packed bytes must be little-endian float32 (length % 4 == 0)"
            )
        arr = np.frombuffer(row, dtype=PACKED_DTYPES[field])
    elif isinstance(row, list | np.ndarray):
        try:
            arr = np.asarray(row, dtype=np.float64)
        except (ValueError, TypeError) as err:
            raise InvalidGroupError(
                f"{field}[{index}]", f"must be a list of numbers ({err})"
            ) from err
        if arr.ndim != 1:
            raise InvalidGroupError(f"{field}[{index}]", "must be a flat list of numbers")
    else:
        raise InvalidGroupError(f"{field}[{index}]", "must be a list of numbers")
    if not np.isfinite(arr).all():
        raise InvalidGroupError(
            f"{field}[{index}]", "contains NaN or infinity; send finite numbers only"
        )
    return arr.astype(PACKED_DTYPES[field], copy=False)


def _rows(raw: dict[str, Any], field: str, size: int | None) -> list[Any] | None:
    rows = raw.get(field)
    if rows is None:
        return None
    if not isinstance(rows, list):
        raise InvalidGroupError(field, "must be a list with one entry per sequence")
    if size is not None and len(rows) != size:
        raise InvalidGroupError(
            field, f"has {len(rows)} entries but tokens has {size} sequences; send one per sequence"
        )
    return rows


def _check_aligned(field: str, rows: list[np.ndarray], lengths: list[int]) -> None:
    for index, (row, length) in enumerate(zip(rows, lengths, strict=True)):
        if len(row) != length:
            raise InvalidGroupError(
                f"{field}[{index}]",
                f"has {len(row)} values but tokens[{index}] has {length}; align it with tokens",
            )


def _check_scores(raw: dict[str, Any], size: int) -> list[float]:
    scores = _rows(raw, "scores", size)
    if scores is None:
        raise InvalidGroupError("scores", "is required: one score per sequence")
    out: list[float] = []
    for index, score in enumerate(scores):
        if isinstance(score, bool) or not isinstance(score, int | float):
            raise InvalidGroupError(f"scores[{index}]", "must be a number")
        if not math.isfinite(score):
            raise InvalidGroupError(f"scores[{index}]", "is NaN or infinite; send a finite score")
        out.append(float(score))
    return out


def _check_messages(raw: dict[str, Any]) -> None:
    chats = _rows(raw, "messages", None)
    for i, chat in enumerate(chats or ()):
        if not isinstance(chat, list):
            raise InvalidGroupError(f"messages[{i}]", "must be a list of chat messages")
        for j, message in enumerate(chat):
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                raise InvalidGroupError(
                    f"messages[{i}][{j}]", "each message needs 'role' and 'content' keys"
                )
            if not isinstance(message["role"], str):
                raise InvalidGroupError(f"messages[{i}][{j}].role", "must be a string")


def _optional_int(raw: dict[str, Any], field: str, minimum: int) -> int | None:
    value = raw.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidGroupError(field, "must be an integer or null")
    if not minimum <= value <= MAX_STEP:
        raise InvalidGroupError(field, f"must be between {minimum} and {MAX_STEP}")
    return value


def check_group(raw: Any, *, batch_size: int | None = None) -> CheckedGroup:
    """Validate one decoded group; ``batch_size`` (when known) bounds the number of sequences."""
    if not isinstance(raw, dict):
        raise InvalidGroupError("body", "a group must be a JSON object with tokens/masks/scores")
    if raw.get("messages") == []:  # Atropos's clients send [] for "no messages"
        raw = {**raw, "messages": None}
    token_rows = _rows(raw, "tokens", None)
    if token_rows is None:
        raise InvalidGroupError("tokens", "is required: one list of token ids per sequence")
    size = len(token_rows)
    if size == 0:
        raise InvalidGroupError("tokens", "the group has no sequences; send at least one")
    if batch_size is not None and size > batch_size:
        raise InvalidGroupError(
            "tokens",
            f"the group has {size} sequences but the trainer's batch_size is {batch_size}; "
            "send smaller groups",
        )
    group: dict[str, Any] = {k: raw.get(k) for k in SCORED_DATA_FIELDS}
    tokens = [_int_row("tokens", i, row) for i, row in enumerate(token_rows)]
    lengths = [len(row) for row in tokens]
    mask_rows = _rows(raw, "masks", size)
    if mask_rows is None:
        raise InvalidGroupError("masks", "is required: tokens' shape, -100 where not trained")
    masks = [_int_row("masks", i, row) for i, row in enumerate(mask_rows)]
    _check_aligned("masks", masks, lengths)
    group["tokens"], group["masks"] = tokens, masks
    group["scores"] = _check_scores(raw, size)
    for field in PACKED_FLOAT_FIELDS:
        rows = _rows(raw, field, size)
        if rows is not None:
            group[field] = [_float_row(field, i, row) for i, row in enumerate(rows)]
            _check_aligned(field, group[field], lengths)
    for field in _OPTIONAL_INT_ROWS:
        rows = _rows(raw, field, size)
        if rows is not None:
            group[field] = [_int_row(field, i, row) for i, row in enumerate(rows)]
            _check_aligned(field, group[field], lengths)
    for field in _DICT_OR_NONE:
        if raw.get(field) is not None and not isinstance(raw[field], dict):
            raise InvalidGroupError(field, "must be an object or null")
    for field in _NESTED_OR_NONE:
        rows = _rows(raw, field, None)
        if rows is not None and not all(isinstance(r, list) for r in rows):
            raise InvalidGroupError(field, "must be [sequence][position][top_k] lists")
    _check_messages(raw)
    check_sequence_fields(raw, size)
    group_id = raw.get("group_id")
    if group_id is not None and (not isinstance(group_id, str) or len(group_id) > _GROUP_ID_MAX):
        raise InvalidGroupError("group_id", f"must be a string of at most {_GROUP_ID_MAX} chars")
    return CheckedGroup(
        group=group,
        size=size,
        tokens=sum(lengths),
        max_len=max(lengths),
        env_id=_optional_int(raw, "env_id", -MAX_STEP),
        group_id=group_id,
        policy_version=_oldest_version(group, _optional_int(raw, "policy_version", 0)),
    )


def _oldest_version(group: dict[str, Any], declared: int | None) -> int | None:
    """The oldest weight version in the group: of its oldest sampled token when the env sent
    per-token (``token_policy_versions``, -1: not sampled) or per-sequence versions, else the
    group's ``policy_version``; staleness is judged on it."""
    versions = [] if declared is None else [declared]
    versions += [v for v in group.get("policy_versions") or () if v is not None]
    for row in group.get("token_policy_versions") or ():
        sampled = row[row >= 0]
        if sampled.size:
            versions.append(int(sampled.min()))
    return min(versions, default=None)
