"""Plain values across the sandbox boundary: a strict JSON encoding and length-prefixed frames.

Standard library only: imported by the judge (``_supervisor``) and the untrusted worker.
Only plain data crosses: None, bool, int, float, complex, str, bytes, list, tuple, dict, set
and frozenset, nested. Decoding builds fresh objects of exactly those types, so nothing the
worker sends can carry behaviour (an ``__eq__`` that is always true, a ``str`` subclass) into
the judge. Ints that do not fit 64 bits travel as hex (no digit limit); floats keep NaN/inf.
"""

from __future__ import annotations

import json
import numbers
import os
import struct
from typing import Any

MAX_FRAME_BYTES = 16 * 1024 * 1024
_HEADER = struct.Struct(">I")
_TAGGED = ("tuple", "set", "frozenset", "dict", "bytes", "complex", "int")


class WireError(ValueError):
    """A frame or value that breaks the format (or a type that cannot cross)."""


def to_plain(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON-ready data, tagging what JSON lacks; TypeError for anything else."""
    if depth > 200:
        raise TypeError("value nested more than 200 levels deep")
    if value is None or isinstance(value, bool | str):
        return value if type(value) in (bool, str, type(None)) else _base(value)
    if isinstance(value, numbers.Integral):
        number = int(value)
        return number if -(2**63) <= number < 2**63 else {"t": "int", "v": format(number, "x")}
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, numbers.Complex):
        return {"t": "complex", "v": [value.real, value.imag]}
    if isinstance(value, bytes | bytearray):
        return {"t": "bytes", "v": bytes(value).hex()}
    if isinstance(value, list):
        return [to_plain(item, depth + 1) for item in value]
    if isinstance(value, tuple):
        return {"t": "tuple", "v": [to_plain(item, depth + 1) for item in value]}
    if isinstance(value, set | frozenset):
        kind = "frozenset" if isinstance(value, frozenset) else "set"
        return {"t": kind, "v": [to_plain(item, depth + 1) for item in value]}
    if isinstance(value, dict):
        pairs = [[to_plain(k, depth + 1), to_plain(v, depth + 1)] for k, v in value.items()]
        return {"t": "dict", "v": pairs}
    raise TypeError(f"a {type(value).__name__} cannot cross the sandbox boundary (plain data only)")


def _base(value: Any) -> Any:
    return str(value) if isinstance(value, str) else bool(value)


def from_plain(data: Any) -> Any:
    """The value :func:`to_plain` described, rebuilt from plain types only."""
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [from_plain(item) for item in data]
    if type(data) is not dict or data.get("t") not in _TAGGED or len(data) != 2:
        raise WireError(f"not a value of the sandbox wire format: {type(data).__name__}")
    kind, raw = data["t"], data.get("v")
    if kind == "int" and type(raw) is str:
        return int(raw, 16)
    if kind == "bytes" and type(raw) is str:
        return bytes.fromhex(raw)
    if kind == "complex" and type(raw) is list and len(raw) == 2:
        return complex(float(raw[0]), float(raw[1]))
    if type(raw) is not list:
        raise WireError(f"bad {kind} value")
    items = [from_plain(item) for item in raw]
    if kind == "tuple":
        return tuple(items)
    if kind == "set":
        return set(items)
    if kind == "frozenset":
        return frozenset(items)
    if kind == "dict" and all(type(pair) is list and len(pair) == 2 for pair in items):
        return {key: value for key, value in items}
    raise WireError(f"bad {kind} value")


def dumps(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def loads(frame: bytes) -> dict[str, Any]:
    try:
        message = json.loads(frame)
    except (ValueError, RecursionError) as error:
        raise WireError(f"unreadable frame: {error}") from None
    if type(message) is not dict:
        raise WireError("a frame must hold a JSON object")
    return message


def frame(message: dict[str, Any]) -> bytes:
    body = dumps(message)
    return _HEADER.pack(len(body)) + body


def write_frame(fd: int, message: dict[str, Any]) -> None:
    data = memoryview(frame(message))
    while data:
        data = data[os.write(fd, data) :]


def read_frame(fd: int) -> dict[str, Any] | None:
    """Blocking read of one frame (the worker's side); None at end of file."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise WireError(f"frame of {size} bytes is over the {MAX_FRAME_BYTES} limit")
    body = _read_exactly(fd, size)
    if body is None:
        return None
    return loads(body)


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class FrameReader:
    """Incremental frames from non-blocking reads (the judge's side)."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk

    def next(self) -> dict[str, Any] | None:
        if len(self.buffer) < _HEADER.size:
            return None
        (size,) = _HEADER.unpack_from(self.buffer)
        if size > MAX_FRAME_BYTES:
            raise WireError(f"frame of {size} bytes is over the {MAX_FRAME_BYTES} limit")
        if len(self.buffer) < _HEADER.size + size:
            return None
        body = bytes(self.buffer[_HEADER.size : _HEADER.size + size])
        del self.buffer[: _HEADER.size + size]
        return loads(body)
