"""Compact bytes for one validated group, and back.

Token ids are uint16 when every id of the group fits (vocabularies up to 65,536: Llama 2,
Mistral, Phi-3, SmolLM) and int32 otherwise; masks become a 1-byte trained flag per position
when they follow the usual ``where(trained, token, -100)`` rule (int32 otherwise); float arrays
are float32; every other field is orjson. A group of G sequences of L tokens costs about 3*G*L
(or 5*G*L) bytes plus its extras.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import msgpack
import numpy as np
import orjson

from atroposlib.errors import InvalidGroupError
from atroposlib.group import MASK_IGNORE_INDEX, SCORED_DATA_FIELDS
from atroposlib.wire.broker import PACKED_FLOAT_FIELDS, PACKED_INT_FIELDS

logger = logging.getLogger(__name__)

_INT = np.dtype("<i4")
_SHORT = np.dtype("<u2")
_FLOAT = np.dtype("<f4")
_FLAG = np.dtype("u1")
_OTHER_INT_FIELDS = tuple(f for f in PACKED_INT_FIELDS if f not in ("tokens", "masks"))
_ARRAY_FIELDS = frozenset(("tokens", "masks", *_OTHER_INT_FIELDS, *PACKED_FLOAT_FIELDS))


def _flat_int(rows: list[np.ndarray]) -> np.ndarray:
    if not rows:
        return np.zeros(0, _INT)
    return np.concatenate(rows).astype(_INT, copy=False)


def _concat(rows: list[np.ndarray], dtype: np.dtype[Any]) -> bytes:
    if not rows:
        return b""
    return np.concatenate(rows).astype(dtype, copy=False).tobytes()


def encode_group(group: dict[str, Any]) -> bytes:
    """``group`` holds per-token fields as lists of 1-D numpy arrays (as validation leaves it)."""
    tokens: list[np.ndarray] = group["tokens"]
    flat_tokens = _flat_int(tokens)
    flat_masks = _flat_int(group["masks"])
    trained = flat_masks != MASK_IGNORE_INDEX
    record: dict[str, Any] = {
        "n": np.fromiter((len(row) for row in tokens), _INT, len(tokens)).tobytes()
    }
    # all ids in 0..65535 exactly when their bitwise OR is (a negative one sets the sign bit)
    if flat_tokens.size == 0 or 0 <= np.bitwise_or.reduce(flat_tokens) <= 0xFFFF:
        record["s"] = flat_tokens.astype(_SHORT).tobytes()
    else:
        record["t"] = flat_tokens.tobytes()
    if not ((flat_masks != flat_tokens) & trained).any():
        record["f"] = trained.view(_FLAG).tobytes()
    else:
        record["m"] = flat_masks.tobytes()
    for name in PACKED_FLOAT_FIELDS:
        rows = group.get(name)
        if rows is not None:
            record[name] = _concat(rows, _FLOAT)
    for name in _OTHER_INT_FIELDS:
        rows = group.get(name)
        if rows is not None:
            record[name] = _concat(rows, _INT)
    extras = {k: v for k, v in group.items() if k not in _ARRAY_FIELDS and v is not None}
    record["x"] = _dump_extras(extras)
    return msgpack.packb(record, use_bin_type=True)


def _dump_extras(extras: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(extras, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:
        for name, value in extras.items():
            try:
                orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
            except TypeError as err:
                raise InvalidGroupError(
                    name, f"holds a value JSON cannot carry ({err}); send only JSON values"
                ) from err
        raise


def _split(flat: np.ndarray, bounds: list[int]) -> list[np.ndarray]:
    return [flat[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]


def _split_bytes(flat: np.ndarray | bytes, bounds: list[int]) -> list[bytes]:
    data = flat if isinstance(flat, bytes) else flat.tobytes()
    return [data[4 * start : 4 * end] for start, end in itertools.pairwise(bounds)]


def decode_group(blob: bytes, *, packed: bool = False) -> dict[str, Any]:
    """Every key of ``SCORED_DATA_FIELDS`` (None when absent); per-token fields as numpy arrays.

    ``packed``: per-token fields as little-endian bytes per sequence instead, exactly what
    :func:`atroposlib.codec.pack_group` makes of the arrays (the msgpack answer), built directly.
    """
    record = msgpack.unpackb(blob, raw=False)
    bounds = [0, *itertools.accumulate(np.frombuffer(record["n"], _INT).tolist())]
    if "s" in record:
        flat_tokens = np.frombuffer(record["s"], _SHORT).astype(_INT)
    else:
        flat_tokens = np.frombuffer(record["t"], _INT)
    if "f" in record:
        untrained = ~np.frombuffer(record["f"], _FLAG).view(bool)
        flat_masks = flat_tokens.copy()
        np.putmask(flat_masks, untrained, MASK_IGNORE_INDEX)
    else:
        flat_masks = np.frombuffer(record["m"], _INT)
    group: dict[str, Any] = dict.fromkeys(SCORED_DATA_FIELDS)
    group.update(orjson.loads(record["x"]))
    if packed:
        group["tokens"] = _split_bytes(flat_tokens, bounds)
        group["masks"] = _split_bytes(flat_masks, bounds)
        for name in (*PACKED_FLOAT_FIELDS, *_OTHER_INT_FIELDS):
            if name in record:
                group[name] = _split_bytes(record[name], bounds)
        return group
    group["tokens"] = _split(flat_tokens, bounds)
    group["masks"] = _split(flat_masks, bounds)
    for name in PACKED_FLOAT_FIELDS:
        if name in record:
            group[name] = _split(np.frombuffer(record[name], _FLOAT), bounds)
    for name in _OTHER_INT_FIELDS:
        if name in record:
            group[name] = _split(np.frombuffer(record[name], _INT), bounds)
    return group
