"""The one parser for JSON a model wrote (tool calls, their arguments, actions), bounded.

``json.loads`` recurses once per nesting level, so ``[[[[...`` of a few thousand levels raises
``RecursionError`` (not ``ValueError``) out of a tool-call parser or a reward, dropping the whole
group or failing a server's request. :func:`loads_model_output` measures the nesting first with
a linear scan that never recurses, bounds the size, and answers :class:`ModelOutputError` (a
``ValueError``) for anything too deep, too large, not JSON, or not writable back as UTF-8 JSON.
Every caller treats that error as a malformed reply.
"""

from __future__ import annotations

import json
import re
from typing import Any, NoReturn

from atroposlib.errors import ModelOutputError

MAX_DEPTH = 64
"""Nesting levels a tool call may use (real ones use a handful)."""
MAX_CHARS = 1 << 20
"""Characters of one JSON block (a tool call's arguments included)."""

_STRUCTURE = re.compile(r'[\[\]{}"\\]')


def nesting_depth(text: str, stop_above: int | None = None) -> int:
    """The deepest ``[``/``{`` nesting of ``text``, brackets inside strings not counted; the
    scan stops at the first level deeper than ``stop_above``.

    >>> nesting_depth('{"a": [1, {"b": "]]]"}]}'), nesting_depth("3")
    (3, 0)
    >>> nesting_depth("[" * 1000, stop_above=64)
    65
    """
    depth = deepest = 0
    in_string = False
    escaped_at = -1
    for match in _STRUCTURE.finditer(text):
        char, position = match.group(), match.start()
        if position == escaped_at:
            continue
        if in_string:
            if char == "\\":
                escaped_at = position + 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if stop_above is not None and deepest > stop_above:
                    break
        elif char in "]}":
            depth -= 1
    return deepest


def _refuse_constant(name: str) -> NoReturn:
    raise ModelOutputError(f"{name} is not JSON")


def loads_model_output(
    text: str, *, max_depth: int = MAX_DEPTH, max_chars: int = MAX_CHARS, strict: bool = True
) -> Any:
    """``json.loads(text)`` of model-written ``text``, or :class:`ModelOutputError` when it is
    malformed, nested deeper than ``max_depth``, longer than ``max_chars``, or decodes to text
    with a lone surrogate (``"\\ud800"``: not UTF-8, so no reply could carry it). ``strict``:
    as ``json.loads``'s (False lets strings hold control characters).

    >>> loads_model_output('{"name": "f", "arguments": {"x": [1, 2]}}')["arguments"]
    {'x': [1, 2]}
    >>> loads_model_output("[" * 100_000 + "]" * 100_000)
    Traceback (most recent call last):
    ...
    atroposlib.errors.ModelOutputError: JSON nested more than 64 levels deep
    >>> loads_model_output('{"x": "[[[[["}')
    {'x': '[[[[['}
    """
    if len(text) > max_chars:
        raise ModelOutputError(f"JSON of {len(text)} characters (at most {max_chars})")
    if nesting_depth(text, stop_above=max_depth) > max_depth:
        raise ModelOutputError(f"JSON nested more than {max_depth} levels deep")
    try:
        value = json.loads(text, strict=strict, parse_constant=_refuse_constant)
    except ModelOutputError:
        raise
    except ValueError as error:  # JSONDecodeError, or an integer of more than 4300 digits
        raise ModelOutputError(f"not JSON: {error}") from error
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        raise ModelOutputError("JSON holds a lone surrogate (not UTF-8 text)") from error
    return value
