"""The one parser for JSON a model wrote (tool calls, their arguments, actions), bounded.

``json.loads`` recurses once per nesting level, so ``[[[[...`` of a few thousand levels raises
``RecursionError`` (not ``ValueError``) out of a tool-call parser or a reward, dropping the whole
group or failing a server's request. :func:`loads_model_output` measures the nesting first with
a linear scan that never recurses, bounds the size, and answers :class:`ModelOutputError` (a
``ValueError``) for anything too deep, too large, not JSON, or not writable back as UTF-8 JSON.
Every caller treats that error as a malformed reply. :func:`loads_python_literal` is the same
promise for a Python literal (``{'q': "what's"}``), which models write where JSON was asked for.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any, NoReturn

from atroposlib.errors import ModelOutputError

MAX_DEPTH = 64
"""Nesting levels a tool call may use (real ones use a handful)."""
MAX_CHARS = 1 << 20
"""Characters of one JSON block (a tool call's arguments included)."""

_STRUCTURE = re.compile(r'[\[\]{}"\\]')
_ANY_BRACKET = re.compile(r"[\[\]{}()]")


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


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: JSON text, but no JSON writer can send it back
        raise ModelOutputError(f"{text} overflows a float")
    return value


def loads_model_output(
    text: str, *, max_depth: int = MAX_DEPTH, max_chars: int = MAX_CHARS, strict: bool = True
) -> Any:
    """``json.loads(text)`` of model-written ``text``, or :class:`ModelOutputError` when it is
    malformed, nested deeper than ``max_depth``, longer than ``max_chars``, holds a number too
    large for a float (``1e999``), or decodes to text with a lone surrogate (``"\\ud800"``: not
    UTF-8, so no reply could carry it). ``strict``:
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
        value = json.loads(
            text, strict=strict, parse_constant=_refuse_constant, parse_float=_finite_float
        )
    except ModelOutputError:
        raise
    except ValueError as error:  # JSONDecodeError, or an integer of more than 4300 digits
        raise ModelOutputError(f"not JSON: {error}") from error
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        raise ModelOutputError("JSON holds a lone surrogate (not UTF-8 text)") from error
    return value


def _bracket_depth(text: str, stop_above: int) -> int:
    """The deepest nesting of any bracket kind, those inside strings counted too (an upper
    bound that needs no knowledge of Python's quoting rules)."""
    depth = deepest = 0
    for match in _ANY_BRACKET.finditer(text):
        if match.group() in "[{(":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > stop_above:
                break
        else:
            depth -= 1
    return deepest


def _as_json_data(value: Any) -> Any:
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise ModelOutputError("a Python literal with a key that is not text")
        return {key: _as_json_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_json_data(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise ModelOutputError(f"{value} is not JSON")
    if value is None or isinstance(value, (str, int, float)):
        return value
    raise ModelOutputError(f"a Python literal holding a {type(value).__name__}, not JSON data")


def loads_python_literal(
    text: str, *, max_depth: int = MAX_DEPTH, max_chars: int = MAX_CHARS
) -> Any:
    """The JSON data of the Python literal ``text`` (``ast.literal_eval``, tuples read as lists),
    or :class:`ModelOutputError` when it is no literal, too deep, too large, or holds what JSON
    cannot (a set, bytes, a complex or infinite number, a non-text key, a lone surrogate).

    >>> loads_python_literal('''{'q': "what's", 'ok': True, 'n': None, 'xy': (1, 2)}''')
    {'q': "what's", 'ok': True, 'n': None, 'xy': [1, 2]}
    >>> loads_python_literal("{'a': {1, 2}}")
    Traceback (most recent call last):
    ...
    atroposlib.errors.ModelOutputError: a Python literal holding a set, not JSON data
    """
    if len(text) > max_chars:
        raise ModelOutputError(f"a literal of {len(text)} characters (at most {max_chars})")
    if _bracket_depth(text, stop_above=max_depth) > max_depth:
        raise ModelOutputError(f"a literal nested more than {max_depth} levels deep")
    try:
        value = ast.literal_eval(text)
    # Python's parser reports its own stack overflow (``-`` * 10**5 + ``1``) as MemoryError.
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as error:
        raise ModelOutputError(f"not a Python literal: {type(error).__name__}") from error
    data = _as_json_data(value)
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        raise ModelOutputError("a literal holding a lone surrogate (not UTF-8 text)") from error
    return data
