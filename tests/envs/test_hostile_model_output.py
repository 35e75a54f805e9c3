"""Model output built to break a parser (nesting, size, text that is not UTF-8) is a malformed
reply at every place that reads model-written JSON, never an exception: a tool-call parser
answers "no call" (the text stays content), a reward scores it as malformed and the other replies
of its group keep their scores, an adapter answers the model with an error or a bad-action score.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from openai.types.chat import ChatCompletion

from atroposlib.envs.adapters.openenv_env import InvalidActionError, reply_to_action
from atroposlib.envs.adapters.vf_client import reply_message as verifiers_reply
from atroposlib.envs.adapters.vf_harness import InProcessChatConfig, InProcessChatHarness
from atroposlib.envs.hermes import parse_tool_calls, tool_calls_as_text
from atroposlib.envs.reward_fns.tool_call_rewards import tool_call_match_reward
from atroposlib.envs.server_handling import tool_call_translator
from atroposlib.envs.server_handling.tool_call_translator import ToolCallTranslator
from atroposlib.inference.tool_calls import PARSERS, StreamedCalls, reply_message, template_message
from atroposlib.utils.tool_call_parser import parse_tool_call
from tests.fakes import ChatCharTokenizer

DEEP = 100_000
GOOD = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
HOSTILE = {
    "deep list": "[" * DEEP + "]" * DEEP,
    "deep object": '{"a":' * DEEP + "1" + "}" * DEEP,
    "deep arguments": '{"name": "f", "arguments": ' + "[" * DEEP + "]" * DEEP + "}",
    "deep object arguments": '{"name": "f", "arguments": ' + '{"a":' * DEEP + "0" + "}" * DEEP
    + "}",
    "deep and unclosed": '{"name": "f", "arguments": ' + "[" * DEEP,
    "10 MB blob": '{"name": "f", "arguments": {"x": "' + "y" * (10 << 20) + '"}}',
    "lone surrogate name": '{"name": "f\\ud800", "arguments": {}}',
    "lone surrogate argument": '{"name": "f", "arguments": {"x": "\\udfff"}}',
    "NaN argument": '{"name": "f", "arguments": {"x": NaN}}',
}  # fmt: skip
"""Tool-call JSON (the inside of a ``<tool_call>`` block) no parser may accept."""
DEEP_IN_A_STRING = '{"name": "f", "arguments": {"x": "' + "[{" * DEEP + '"}}'
"""Valid: brackets inside a string are text, not nesting."""
ARGUMENTS = {
    "deep list": "[" * DEEP + "]" * DEEP,
    "deep object": '{"a":' * DEEP + "1" + "}" * DEEP,
    "10 MB blob": '{"x": "' + "y" * (10 << 20) + '"}',
    "lone surrogate": '{"x": "\\ud800"}',
}
"""Tool-call ``arguments`` strings no reader of a call's arguments may accept."""


def blocks(name: str) -> list[str]:
    """The hostile JSON in a closed ``<tool_call>`` block, and in an unclosed one after text."""
    return [f"<tool_call>{HOSTILE[name]}</tool_call>", f"Let me see.<tool_call>{HOSTILE[name]}"]


# ---- tool-call parsers: the block stays content, no call --------------------------------


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_hermes_parser_leaves_a_hostile_block_in_the_content(name: str) -> None:
    for text in blocks(name):
        content, calls = parse_tool_calls(text, allow_unclosed=True)
        assert calls == [] and content == text


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_server_s_reply_is_the_text_as_content(name: str) -> None:
    for text in blocks(name):
        message = reply_message(text, PARSERS["hermes"])
        assert message.tool_calls == [] and message.content == text
        json.dumps(message.model_dump(mode="json"), ensure_ascii=False).encode("utf-8")
        streamed = StreamedCalls(PARSERS["hermes"])
        middle = len(text) // 2
        first = streamed.push(text[:middle], finished=False)
        last = streamed.push(text[middle:], finished=True)
        assert first[1] == last[1] == [] and first[0] + last[0] == text and not streamed.called


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_proxy_s_translator_answers_text_and_no_calls(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tool_call_translator, "_vllm_classes", lambda: None)
    translator = ToolCallTranslator(ChatCharTokenizer(), parser_name="hermes")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    for text in blocks(name):
        assert translator.parse_model_output(text, "auto", tools) == (text, None, "stop")


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_atropos_0_4_s_parser_answers_its_error_call(name: str) -> None:
    for tools in (None, [{"name": "f"}]):
        assert parse_tool_call(f"<tool_call>{HOSTILE[name]}</tool_call>", tools) == (
            "-ERROR-", {}, True,
        )  # fmt: skip


def test_atropos_0_4_s_parser_refuses_a_name_that_is_not_text() -> None:
    for tools in (None, [{"name": "f"}]):
        reply = '<tool_call>{"name": ["f"], "arguments": {}}</tool_call>'
        assert parse_tool_call(reply, tools) == ("-ERROR-", {}, True)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_verifiers_client_sees_a_reply_without_calls(name: str) -> None:
    for text in blocks(name):
        assert verifiers_reply(text).tool_calls is None


def test_deep_nesting_inside_a_string_is_still_a_call_everywhere() -> None:
    text = f"<tool_call>{DEEP_IN_A_STRING}</tool_call>"
    arguments = {"x": "[{" * DEEP}
    [call] = parse_tool_calls(text)[1]
    assert json.loads(call["function"]["arguments"]) == arguments
    [served] = reply_message(text, PARSERS["hermes"]).tool_calls
    assert json.loads(served["function"]["arguments"]) == arguments
    assert parse_tool_call(text) == ("f", arguments, False)
    expected = [[{"name": "f", "arguments": arguments}]]
    assert tool_call_match_reward([text], expected) == [1.0]


# ---- past calls sent back in a chat: kept as text, never decoded ------------------------


@pytest.mark.parametrize("name", sorted(ARGUMENTS))
def test_past_calls_with_hostile_arguments_render_as_the_text_sent(name: str) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": ARGUMENTS[name]}}
    message = {"role": "assistant", "content": "", "tool_calls": [call]}
    assert template_message(message)["tool_calls"] == [call]
    block = tool_calls_as_text(message)["content"]
    assert block.startswith("<tool_call>\n") and block.endswith("\n</tool_call>")
    written = json.loads(block.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert written == {"name": "f", "arguments": ARGUMENTS[name]}


# ---- rewards: malformed, the group keeps its other scores -------------------------------


def test_the_reward_scores_hostile_replies_as_malformed_and_keeps_the_group() -> None:
    replies = [GOOD, *(f"<tool_call>{text}</tool_call>" for text in HOSTILE.values()), "no call"]
    expected = [[{"name": "f", "arguments": {"x": 1}}]] * len(replies)
    scores = tool_call_match_reward(replies, expected)
    assert scores == [1.0, *[-0.5] * len(HOSTILE), 0.0]


@pytest.mark.parametrize("name", sorted(ARGUMENTS))
def test_the_reward_scores_hostile_string_arguments_as_malformed(name: str) -> None:
    reply = "<tool_call>" + json.dumps({"name": "f", "arguments": ARGUMENTS[name]}) + "</tool_call>"
    assert tool_call_match_reward([reply, GOOD], [[{"name": "f", "arguments": {"x": 1}}]] * 2) == [
        -0.5, 1.0,
    ]  # fmt: skip


# ---- adapters: an error answer to the model, or the bad-action score --------------------


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_an_openenv_reply_with_hostile_json_is_an_invalid_action(name: str) -> None:
    with pytest.raises(InvalidActionError):
        reply_to_action(f"I pick {HOSTILE[name]}", "")


class ScriptedChat:
    """An ``AsyncOpenAI`` stand-in answering ``chat.completions.create`` from a script."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self._replies = iter(replies)
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    async def _create(self, **_: Any) -> ChatCompletion:
        message = {"role": "assistant", **next(self._replies)}
        return ChatCompletion.model_validate({
            "id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        })  # fmt: skip


@pytest.mark.parametrize("name", sorted(ARGUMENTS))
async def test_the_verifiers_harness_answers_a_hostile_call_with_an_error(name: str) -> None:
    function = {"name": "lookup", "arguments": ARGUMENTS[name]}
    client = ScriptedChat([
        {"content": None, "tool_calls": [{"id": "c1", "type": "function", "function": function}]},
        {"content": "done"},
    ])  # fmt: skip
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    harness = InProcessChatHarness(InProcessChatConfig())
    result = await harness._chat(client, "m", messages, [], {}, {})  # type: ignore[arg-type]
    assert result.exit_code == 0
    tool_answer = messages[2]
    assert tool_answer["role"] == "tool" and tool_answer["tool_call_id"] == "c1"
    assert tool_answer["content"].startswith("error: invalid JSON in tool arguments")
    assert messages[-1]["content"] == "done"


class HermesLikeVllmParser:
    """A stand-in for vLLM's hermes parser where vLLM does not import: like vLLM 0.32's, it
    writes the decoded arguments back with ``json.dumps(..., ensure_ascii=False)`` and catches
    every exception (a lone surrogate survives; ``RecursionError`` is "no call")."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def extract_tool_calls(self, text: str, request: Any) -> Any:
        try:
            decoded = json.loads(text.removeprefix("<tool_call>").removesuffix("</tool_call>"))
            function = SimpleNamespace(
                name=decoded["name"], arguments=json.dumps(decoded["arguments"], ensure_ascii=False)
            )
        except Exception:
            return SimpleNamespace(tools_called=False, tool_calls=[], content=text)
        call = SimpleNamespace(id="call_1", function=function)
        return SimpleNamespace(tools_called=True, tool_calls=[call], content=None)


@pytest.mark.parametrize("name", ["lone surrogate name", "lone surrogate argument"])
def test_the_translator_over_a_vllm_parser_answers_text_for_a_call_no_reply_can_carry(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = SimpleNamespace(get_tool_parser=lambda _: HermesLikeVllmParser)
    fake_vllm = {"ToolParserManager": manager, "ChatCompletionRequest": SimpleNamespace}
    monkeypatch.setattr(tool_call_translator, "_vllm_classes", lambda: fake_vllm)
    translator = ToolCallTranslator(ChatCharTokenizer(), parser_name="hermes")
    assert translator.parser is not None
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    text = f"<tool_call>{HOSTILE[name]}</tool_call>"
    assert translator.parse_model_output(text, "auto", tools) == (text, None, "stop")
    [call] = translator.parse_model_output(GOOD, "auto", tools)[1] or []
    assert (call.function.name, call.function.arguments) == ("f", '{"x": 1}')
