"""JSON request bodies of groups, decoded with simdjson straight into numpy rows.

A JSON group is mostly token ids; turning each into a Python int (orjson) and then into int32
(validation) costs ~90 ns per token, the largest cost of the JSON ingest path. simdjson parses
the document once and copies each homogeneous number array into a buffer without making
Python objects (~20 ns per token). Everything else in a group (scores, messages, overrides, ...)
becomes plain Python as usual.

:func:`decode_groups` answers None whenever a body is not the common, well-formed case (not
JSON to simdjson, a token row with floats, booleans or values past int64, ...): the caller then
decodes it the ordinary way, whose validation accepts what the protocol allows and names the
field of anything it refuses. So this module only ever speeds a body up; it decides nothing.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import numpy as np
import simdjson

from atroposlib.wire.broker import PACKED_FLOAT_FIELDS, PACKED_INT_FIELDS

logger = logging.getLogger(__name__)

_INT32 = np.iinfo(np.int32)


class _Fallback(Exception):
    """This body takes the ordinary decoding path."""


class _Decoder:
    """One reusable simdjson parser (its buffers are kept between documents)."""

    def __init__(self) -> None:
        self._parser = simdjson.Parser()

    def parse(self, body: bytes) -> Any:
        try:
            return self._parser.parse(body)
        except RuntimeError:
            # Either the document (a number past 64 bits, say: the retry raises again) or a
            # document of the previous parse still referenced somewhere, in which case
            # simdjson refuses to reuse its parser: start a new one.
            self._parser = simdjson.Parser()
            return self._parser.parse(body)


_decoder = _Decoder()


def decode_groups(body: bytes) -> dict[str, Any] | list[Any] | None:
    """A group (JSON object) or list of groups, per-token rows as numpy arrays; None to fall back.

    Token and mask rows come back as int32 arrays (values checked to fit), float rows as
    float64 arrays; validation finishes the checks as for any decoded group.
    """
    try:
        document = _decoder.parse(body)
    except (ValueError, RuntimeError, UnicodeDecodeError):
        return None
    try:
        if isinstance(document, simdjson.Object):
            return _group(document)
        if isinstance(document, simdjson.Array):
            return [_group(item) for item in document]
        return None
    except _Fallback:
        return None
    finally:
        del document


def _group(item: Any) -> dict[str, Any]:
    if not isinstance(item, simdjson.Object):
        raise _Fallback
    group: dict[str, Any] = {}
    for key in item:
        try:
            value = item[key]
        except KeyError as error:  # simdjson cannot look up a key holding an escaped NUL
            raise _Fallback from error
        if key in PACKED_INT_FIELDS:
            group[key] = _int_rows(value)
        elif key in PACKED_FLOAT_FIELDS:
            group[key] = _rows(value, _float_row)
        else:
            group[key] = _plain(value)
    return group


def _rows(value: Any, convert: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, simdjson.Array):
        raise _Fallback
    return [convert(row) for row in value]


def _int_rows(value: Any) -> list[np.ndarray] | None:
    """int32 views of one array: the int32 range is checked once per field, not once per row."""
    rows = _rows(value, _int64_row)
    if not rows:
        return rows
    flat = np.concatenate(rows)
    if flat.size and (flat.min() < _INT32.min or flat.max() > _INT32.max):
        raise _Fallback
    narrowed = flat.astype(np.int32)
    bounds = [0, *itertools.accumulate(len(row) for row in rows)]
    return [narrowed[start:end] for start, end in itertools.pairwise(bounds)]


def _int64_row(row: Any) -> np.ndarray:
    if not isinstance(row, simdjson.Array):
        raise _Fallback
    try:
        return np.frombuffer(row.as_buffer(of_type="i"), dtype=np.int64)
    except (TypeError, ValueError) as err:  # floats, booleans, strings, numbers past int64
        raise _Fallback from err


def _float_row(row: Any) -> np.ndarray:
    if not isinstance(row, simdjson.Array):
        raise _Fallback
    try:
        return np.frombuffer(row.as_buffer(of_type="d"), dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise _Fallback from err


def _plain(value: Any) -> Any:
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value
