"""JSON from model output, bounded: a reply nested or sized to break a parser is malformed.

``json.loads`` recurses once per nesting level, so ``[[[[...`` of a few thousand levels
raises ``RecursionError`` (not ``ValueError``) out of a tool-call parser or a reward and drops
the whole group. :func:`loads_bounded` measures the nesting first, without recursion, and
answers ``ValueError`` for anything too deep or too large, as for any other malformed JSON.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64
"""Nesting levels a tool call may use (real ones use a handful)."""
MAX_CHARS = 1 << 20
"""Characters of one JSON block (a tool call's arguments included)."""


def nesting_depth(text: str) -> int:
    """The deepest ``[``/``{`` nesting of ``text``, brackets inside strings not counted.

    >>> nesting_depth('{"a": [1, {"b": "]]]"}]}'), nesting_depth("3")
    (3, 0)
    """
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def loads_bounded(text: str, max_depth: int = MAX_DEPTH, max_chars: int = MAX_CHARS) -> Any:
    """``json.loads(text)``, or ValueError when it is malformed, too deep or too large.

    >>> loads_bounded('{"name": "f", "arguments": {"x": [1, 2]}}')["arguments"]
    {'x': [1, 2]}
    >>> loads_bounded("[" * 100_000 + "]" * 100_000)
    Traceback (most recent call last):
    ...
    ValueError: JSON nested 100000 levels deep (at most 64)
    """
    if len(text) > max_chars:
        raise ValueError(f"JSON of {len(text)} characters (at most {max_chars})")
    depth = nesting_depth(text)
    if depth > max_depth:
        raise ValueError(f"JSON nested {depth} levels deep (at most {max_depth})")
    return json.loads(text)
