"""Model output built to break a parser (nesting, size) is a malformed reply, never an error:
it is scored as malformed and the other replies of its group keep their scores."""

from __future__ import annotations

import pytest

from atroposlib.envs.hermes import parse_tool_calls, tool_calls_as_text
from atroposlib.envs.reward_fns.tool_call_rewards import tool_call_match_reward

GOOD = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
HOSTILE = {
    "deep list": "[" * 200_000 + "]" * 200_000,
    "deep object": '{"a":' * 50_000 + "1" + "}" * 50_000,
    "deep arguments": '{"name": "f", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "huge": '{"name": "f", "arguments": {"x": "' + "y" * (2 << 20) + '"}}',
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_parser_leaves_a_hostile_block_in_the_content(name: str) -> None:
    text = f"<tool_call>{HOSTILE[name]}</tool_call>"
    content, calls = parse_tool_calls(text, allow_unclosed=True)
    assert calls == [] and content == text
    message = {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": HOSTILE[name]}}]}  # fmt: skip
    assert "<tool_call>" in tool_calls_as_text(message)["content"]


def test_the_reward_scores_hostile_replies_as_malformed_and_keeps_the_group() -> None:
    replies = [GOOD, *(f"<tool_call>{text}</tool_call>" for text in HOSTILE.values()), "no call"]
    expected = [[{"name": "f", "arguments": {"x": 1}}]] * len(replies)
    scores = tool_call_match_reward(replies, expected)
    assert scores == [1.0, *[-0.5] * len(HOSTILE), 0.0]
