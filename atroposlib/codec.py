"""Bodies on the wire: JSON (Atropos's format) and the fast ``application/msgpack`` encoding.

In the fast encoding, every per-token field (``PACKED_INT_FIELDS`` and ``PACKED_FLOAT_FIELDS``)
of a group is a list with one ``bytes`` object per sequence: little-endian int32 for token ids
and masks, float32 for the float arrays. Plain nested lists are accepted there too. Decoded
groups are plain dicts; per-token fields may then be lists of lists or lists of 1-D numpy
arrays, and :func:`to_arrays` turns either into numpy.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np
import orjson

from atroposlib.errors import RequestBodyError
from atroposlib.wire.broker import (
    PACKED_FLOAT_DTYPE,
    PACKED_FLOAT_FIELDS,
    PACKED_INT_DTYPE,
    PACKED_INT_FIELDS,
)
from atroposlib.wire.common import JSON_CONTENT_TYPE, MSGPACK_CONTENT_TYPE

logger = logging.getLogger(__name__)

PACKED_DTYPES: dict[str, np.dtype[Any]] = {
    **{name: np.dtype(PACKED_INT_DTYPE) for name in PACKED_INT_FIELDS},
    **{name: np.dtype(PACKED_FLOAT_DTYPE) for name in PACKED_FLOAT_FIELDS},
}
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def is_msgpack(content_type: str | None) -> bool:
    """True when a Content-Type or Accept header asks for the fast encoding."""
    return content_type is not None and MSGPACK_CONTENT_TYPE in content_type.lower()


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        raise TypeError("bytes cannot travel as JSON; use the msgpack encoding")
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def dumps_json(obj: Any) -> bytes:
    """JSON bytes; numpy arrays and scalars become plain numbers."""
    return orjson.dumps(obj, default=_json_default, option=_JSON_OPTIONS)


def _pack_value(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot encode {type(value).__name__} as msgpack")


def pack_group(group: Mapping[str, Any]) -> dict[str, Any]:
    """A group for the fast encoding: per-token fields as one little-endian bytes per sequence."""
    packed = dict(group)
    for name, dtype in PACKED_DTYPES.items():
        rows = group.get(name)
        if rows is not None:
            packed[name] = [np.asarray(row, dtype=dtype).tobytes() for row in rows]
    return packed


def to_arrays(rows: Any, dtype: np.dtype[Any]) -> list[np.ndarray]:
    """One writable 1-D array per sequence from a list of bytes, lists or arrays (no checks)."""
    out: list[np.ndarray] = []
    for row in rows:
        if isinstance(row, bytes | bytearray | memoryview):
            out.append(np.frombuffer(row, dtype=dtype).copy())
        else:
            out.append(np.asarray(row, dtype=dtype))
    return out


def unpack_group(group: Mapping[str, Any]) -> dict[str, Any]:
    """Per-token fields of a decoded group as lists of 1-D numpy arrays, whatever the encoding."""
    out = dict(group)
    for name, dtype in PACKED_DTYPES.items():
        rows = out.get(name)
        if rows is not None:
            out[name] = to_arrays(rows, dtype)
    return out


def encode(obj: Any, content_type: str | None) -> tuple[bytes, str]:
    """Encode a body (groups may hold numpy arrays) as JSON or msgpack; returns (body, type).

    For msgpack, the groups inside must already be packed with :func:`pack_group`.
    """
    if is_msgpack(content_type):
        return msgpack.packb(obj, default=_pack_value, use_bin_type=True), MSGPACK_CONTENT_TYPE
    return dumps_json(obj), JSON_CONTENT_TYPE


def decode(body: bytes, content_type: str | None) -> Any:
    """Decode a request or response body by its Content-Type; bad bytes raise a 400 error."""
    if is_msgpack(content_type):
        try:
            return msgpack.unpackb(body, raw=False, strict_map_key=False)
        except (ValueError, TypeError, msgpack.UnpackException) as err:  # TypeError: a list key
            raise RequestBodyError(400, f"body is not valid msgpack: {err}") from err
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:  # Python clients send NaN / Infinity literals; decode them so validation can name them
        return json.loads(body)
    except RecursionError as err:
        raise RequestBodyError(400, "body is nested too deeply to decode") from err
    except (ValueError, UnicodeDecodeError) as err:
        raise RequestBodyError(
            400, f"body is not valid JSON ({err}); send JSON or set Content-Type to msgpack"
        ) from err
