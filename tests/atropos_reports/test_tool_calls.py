"""Atropos reports about reading a model's tool call (register: docs/atropos-reports.md).

#478: ``parse_tool_call`` turned every ``'`` into ``"`` before parsing, so a valid JSON call
whose argument holds an apostrophe came back as ``-ERROR-`` and tool-use environments scored a
correct call as an invalid action. The edge cases are what a hostile model would write: each
gives the parsed call or the documented error value, never an exception.
"""

from __future__ import annotations

from typing import Any

import pytest

from atroposlib.utils.tool_call_parser import ERROR_TOOL_NAME, parse_tool_call

TOOLS = [{"name": "get_weather"}]
ERROR = (ERROR_TOOL_NAME, {}, True)


def call(content: str) -> str:
    return f"<tool_call>{content}</tool_call>"


def test_478_an_apostrophe_in_a_json_argument_is_kept() -> None:
    reply = call('{"name": "get_weather", "arguments": {"q": "what\'s the weather"}}')
    assert parse_tool_call(reply, TOOLS) == ("get_weather", {"q": "what's the weather"}, False)


PARSED: dict[str, tuple[str, dict[str, Any]]] = {
    # JSON, as the model was asked to write it
    '{"name": "get_weather", "arguments": {"q": "don\'t, it\'s the user\'s file"}}':
        ("get_weather", {"q": "don't, it's the user's file"}),
    '{"name": "get_weather", "arguments": {"q": "say \\"hi\\" and \'bye\'"}}':
        ("get_weather", {"q": "say \"hi\" and 'bye'"}),
    '{"name": "get_weather", "arguments": {"q": "l\'été à Zürich ☀️ 東京\'s"}}':
        ("get_weather", {"q": "l'été à Zürich ☀️ 東京's"}),
    '{"name": "get_weather", "arguments": {"q": "\\u2019s \\u00e9"}}':
        ("get_weather", {"q": "\u2019s \u00e9"}),
    '{"name": "get_weather", "arguments": {"q": "a\'b", "n": [1, {"k": "\'"}]}}':
        ("get_weather", {"q": "a'b", "n": [1, {"k": "'"}]}),
    '  {"name": "get_weather", "arguments": {}}\n':
        ("get_weather", {}),
    # a Python dict, which Atropos 0.4 read (by swapping quotes) and we read as Python
    "{'name': 'get_weather', 'arguments': {'q': 'rain'}}":
        ("get_weather", {"q": "rain"}),
    "{'name': 'get_weather', 'arguments': {'q': \"what's up\"}}":
        ("get_weather", {"q": "what's up"}),
    "{'name': 'get_weather', 'arguments': {'q': 'it\\'s', 'ok': True, 'n': None}}":
        ("get_weather", {"q": "it's", "ok": True, "n": None}),
    # half Python, half JSON: Atropos 0.4's quote swap still reads it
    "{'name': 'get_weather', 'arguments': {'metric': true, 'days': null}}":
        ("get_weather", {"metric": True, "days": None}),
}  # fmt: skip


@pytest.mark.parametrize("content", sorted(PARSED))
def test_a_call_in_any_quoting_a_model_uses_is_parsed(content: str) -> None:
    name, arguments = PARSED[content]
    assert parse_tool_call(call(content), TOOLS) == (name, arguments, False)
    assert parse_tool_call(f"Sure, checking.\n{call(content)}\nDone.", TOOLS)[2] is False


UNREADABLE = {
    "text after the object": '{"name": "get_weather", "arguments": {}} and then some',
    "unclosed object": '{"name": "get_weather", "arguments": {"q": "it\'s"',
    "an apostrophe inside single quotes": """{"name": "get_weather", "arguments": {"q": 'it's'}}""",
    "a set argument": "{'name': 'get_weather', 'arguments': {'q': {1, 2}}}",
    "bytes argument": "{'name': 'get_weather', 'arguments': {'q': b'x'}}",
    "complex number": "{'name': 'get_weather', 'arguments': {'q': 1j}}",
    "infinite number": "{'name': 'get_weather', 'arguments': {'q': 1e999}}",
    "JSON number beyond a float": '{"name": "get_weather", "arguments": {"q": -1e999}}',
    "non-text key": "{'name': 'get_weather', 'arguments': {1: 'x'}}",
    "tuple key": "{'name': 'get_weather', 'arguments': {(1, 2): 'x'}}",
    "a function call": "{'name': 'get_weather', 'arguments': {'q': __import__('os').getcwd()}}",
    "a name": "{'name': get_weather, 'arguments': {}}",
    "lone surrogate in a python string": "{'name': 'get_weather', 'arguments': {'q': '\\ud800'}}",
    "deep parentheses": "{'name': 'get_weather', 'arguments': " + "(" * 5000 + ")" * 5000 + "}",
    "deep python list": "{'name': 'get_weather', 'arguments': " + "[" * 5000 + "]" * 5000 + "}",
    "unary chain": "{'name': 'get_weather', 'arguments': {'q': " + "-" * 100_000 + "1}}",
    "sum chain": "{'name': 'get_weather', 'arguments': {'q': " + "1+" * 100_000 + "1}}",
    "huge integer": "{'name': 'get_weather', 'arguments': {'q': " + "9" * 10_000 + "}}",
    "a list, not a call": "['get_weather', {}]",
    "a quoted string": "'get_weather'",
    "empty": "   ",
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_what_is_no_call_gives_the_documented_error_value(case: str) -> None:
    assert parse_tool_call(call(UNREADABLE[case]), TOOLS) == ERROR
    assert parse_tool_call(call(UNREADABLE[case])) == ERROR


def test_a_call_to_a_tool_not_offered_is_an_error_with_its_arguments() -> None:
    reply = call('{"name": "rm_rf", "arguments": {"path": "the user\'s home"}}')
    assert parse_tool_call(reply, TOOLS) == (ERROR_TOOL_NAME, {"path": "the user's home"}, True)
