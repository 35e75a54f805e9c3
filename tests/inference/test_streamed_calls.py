"""``StreamedCalls``: a reply cut into pieces anywhere gives the content and calls of the
same reply parsed whole."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from atroposlib.inference.tool_calls import PARSERS, StreamedCalls

HERMES = PARSERS["hermes"]
CALL = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
REPLIES = [
    "Plain text, no call.",
    CALL,
    f"Let me check. {CALL}",
    f"{CALL}\n{CALL.replace('f', 'g')}",
    "<tool_call>{oops}</tool_call> then text",
    '<tool_call>{oops}</tool_call><tool_call>{"name": "h"}</tool_call>',
    '<tool_call>{"name": "unclosed", "arguments": {}}',
    "a < b and <tool not a call",
]


def streamed(text: str, cuts: list[int]) -> tuple[str, list[dict[str, Any]], bool]:
    reply = StreamedCalls(HERMES)
    content, calls = "", []
    bounds = [0, *cuts, len(text)]
    for n, (start, end) in enumerate(itertools.pairwise(bounds)):
        piece, new = reply.push(text[start:end], finished=n == len(bounds) - 2)
        content += piece
        calls += new
    return content, calls, reply.called


def without_ids(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in call.items() if k not in ("id", "index")} for call in calls]


@pytest.mark.parametrize("text", REPLIES)
def test_any_cut_gives_the_whole_reply_s_calls_and_content(text: str) -> None:
    content, calls = HERMES.parse(text)
    for cuts in ([], *([i] for i in range(1, len(text))), list(range(1, len(text)))):
        got_content, got_calls, called = streamed(text, cuts)
        assert without_ids(got_calls) == without_ids(calls)
        assert [call["index"] for call in got_calls] == list(range(len(calls)))
        assert called == bool(calls)
        if calls:
            assert got_content.strip() == (content or "")
        else:
            assert got_content == text


def test_a_closed_call_is_sent_before_the_reply_ends() -> None:
    reply = StreamedCalls(HERMES)
    assert reply.push("Hi <tool_", finished=False) == ("Hi ", [])
    content, [call] = reply.push(CALL[len("<tool_") :] + "\n<tool", finished=False)
    assert content == "" and call["index"] == 0 and call["function"]["name"] == "f"
    assert reply.push("_call>", finished=True) == ("", [])
