"""Tool-call rewards: parse ``<tool_call>{json}</tool_call>`` blocks and match them exactly.

Arguments are normalised before the comparison: JSON-encoded argument strings are decoded, keys
sorted, integral floats made ints, strings stripped; parallel calls match as a multiset.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from atroposlib.envs.reward_fns.registry import completion_text, register_reward
from atroposlib.errors import ModelOutputError
from atroposlib.utils.bounded_json import loads_model_output

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _normalize(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k).strip(): _normalize(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [_normalize(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        return value.strip()
    return value


def normalize_call(call: dict[str, Any]) -> str | None:
    """A canonical string for one call (``{"name", "arguments"}``), None when malformed.

    >>> normalize_call({"name": "add", "arguments": '{"b": 2.0, "a": " 1 "}'})
    '{"arguments": {"a": "1", "b": 2}, "name": "add"}'
    >>> normalize_call({"arguments": {}}) is None
    True
    """
    if "function" in call and isinstance(call["function"], dict):  # OpenAI's tool_calls shape
        call = call["function"]
    name, arguments = call.get("name"), call.get("arguments", {})
    if not isinstance(name, str) or not name.strip():
        return None
    if isinstance(arguments, str):
        try:
            arguments = loads_model_output(arguments) if arguments.strip() else {}
        except ModelOutputError:
            return None
    if not isinstance(arguments, dict):
        return None
    canonical = {"arguments": _normalize(arguments), "name": name.strip()}
    return json.dumps(canonical, sort_keys=True, ensure_ascii=False)


def parse_tool_calls(text: str) -> list[str] | None:
    """Canonical forms of every ``<tool_call>`` in ``text``; None when any block is malformed.

    >>> parse_tool_calls('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    ['{"arguments": {"x": 1}, "name": "f"}']
    >>> parse_tool_calls("<tool_call>{not json}</tool_call>") is None
    True
    >>> parse_tool_calls("plain answer")
    []
    """
    calls = []
    for block in _TOOL_CALL.findall(text):
        try:
            decoded = loads_model_output(block)
        except ModelOutputError:
            return None
        canonical = normalize_call(decoded) if isinstance(decoded, dict) else None
        if canonical is None:
            return None
        calls.append(canonical)
    return calls


@register_reward("tool_call_match")
def tool_call_match_reward(
    completions: Sequence[Any], expected_calls: Sequence[Sequence[dict[str, Any]]], **_: object
) -> list[float]:
    """1.0 when the reply's calls equal the expected calls (as a multiset), 0.0 when they differ
    or no call is made, -0.5 when a block is malformed JSON. An empty expectation means "answer
    without calling a tool".

    >>> expected = [[{"name": "weather", "arguments": {"city": "Paris", "days": 2}}]] * 4
    >>> tool_call_match_reward([
    ...     '<tool_call>{"name": "weather", "arguments": {"days": 2.0, "city": "Paris"}}'
    ...     '</tool_call>',
    ...     '<tool_call>{"name": "weather", "arguments": {"city": "Rome", "days": 2}}</tool_call>',
    ...     '<tool_call>{"name": "weather", "arguments": {city: Paris}}</tool_call>',
    ...     "It is sunny.",
    ... ], expected)
    [1.0, 0.0, -0.5, 0.0]
    """
    scores = []
    for completion, calls in zip(completions, expected_calls, strict=True):
        got = parse_tool_calls(completion_text(completion))
        if got is None:
            scores.append(-0.5)
            continue
        want = [normalize_call(dict(call)) for call in calls]
        scores.append(1.0 if sorted(got) == sorted(c or "" for c in want) else 0.0)
    return scores
