"""ToolCallTranslator: a reply's raw text <-> OpenAI tool_calls, with our hermes parser and,
where vLLM imports, with vLLM's."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest

from atroposlib.envs.server_handling import tool_call_translator
from atroposlib.envs.server_handling.tool_call_translator import ToolCall, ToolCallTranslator
from atroposlib.errors import ConfigError
from tests.fakes import ChatCharTokenizer

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
CALL = '<tool_call>{"name": "search", "arguments": {"query": "cats"}}</tool_call>'
PARSERS = ["builtin", *(["vllm"] if tool_call_translator.VLLM_AVAILABLE else [])]


@pytest.fixture(params=PARSERS)
def translator(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    if request.param == "builtin":
        monkeypatch.setattr(tool_call_translator, "_vllm_classes", lambda: None)
    made = ToolCallTranslator(ChatCharTokenizer(), parser_name="hermes")
    assert (made.parser is None) == (request.param == "builtin")
    return made


def test_vllm_available_says_whether_vllm_imports() -> None:
    assert tool_call_translator.VLLM_AVAILABLE is (importlib.util.find_spec("vllm") is not None)


def test_a_tool_call_becomes_an_openai_tool_call_remembered_by_id(translator: Any) -> None:
    content, calls, finish = translator.parse_model_output(CALL, tool_choice="auto", tools=TOOLS)
    assert finish == "tool_calls" and not (content or "").strip()
    [call] = calls
    assert isinstance(call, ToolCall) and call.type == "function"
    assert call.function.name == "search" and json.loads(call.function.arguments) == {
        "query": "cats"
    }
    assert call["function"]["name"] == "search" and call.get("id") == call.id
    assert translator.call_id_to_raw_text == {call.id: CALL}


@pytest.mark.parametrize(
    ("raw", "names", "content"),
    [
        (f"Let me look.\n{CALL}", ["search"], "Let me look."),
        (CALL.removesuffix("</tool_call>"), ["search"], None),
        (f"{CALL}\n{CALL.replace('search', 'fetch')}", ["search", "fetch"], None),
    ],
    ids=["content-first", "unclosed-last-block", "two-calls"],
)
def test_replies_with_calls(translator: Any, raw: str, names: list[str], content: Any) -> None:
    got_content, calls, finish = translator.parse_model_output(raw, "auto", TOOLS)
    assert finish == "tool_calls" and [c.function.name for c in calls] == names
    assert (got_content or "").strip() == (content or "")


@pytest.mark.parametrize(
    ("raw", "tool_choice", "tools"),
    [
        ("It is 72 degrees.", "auto", TOOLS),
        ("<tool_call>not json</tool_call>", "auto", TOOLS),
        (CALL, "none", TOOLS),
        (CALL, "auto", None),
    ],
    ids=["plain-text", "malformed", "tool-choice-none", "no-tools"],
)
def test_replies_that_stay_text(translator: Any, raw: str, tool_choice: str, tools: Any) -> None:
    assert translator.parse_model_output(raw, tool_choice, tools) == (raw, None, "stop")
    assert translator.call_id_to_raw_text == {}


def test_a_handed_out_call_renders_back_as_the_exact_reply(translator: Any) -> None:
    raw = f"<think>cats?</think>\n{CALL}"
    _, calls, _ = translator.parse_model_output(raw, "auto", TOOLS)
    chat = [
        {"role": "user", "content": "Find cats"},
        {"role": "assistant", "content": "ignored", "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "5 cats"},
    ]
    converted = translator.convert_messages_for_template(chat)
    assert converted == [chat[0], {"role": "assistant", "content": raw}, chat[2]]
    dumped = [call.model_dump() for call in calls]
    assert translator.reconstruct_raw_text_from_tool_calls(dumped) == raw


def test_calls_it_never_saw_are_written_as_hermes_blocks(translator: Any) -> None:
    call = {"id": "x", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    block = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    assert translator.reconstruct_raw_text_from_tool_calls([call, call]) == f"{block}\n{block}"
    assert translator.reconstruct_raw_text_from_tool_calls([]) == ""
    [converted] = translator.convert_messages_for_template(
        [{"role": "assistant", "content": "Checking.", "tool_calls": [call]}]
    )
    assert converted == {"role": "assistant", "content": f"Checking.\n{block}"}


def test_decoding_keeps_special_tokens_only_with_tools(translator: Any) -> None:
    ids = [1, 72, 105]
    assert translator.decode_with_tool_awareness(ids, has_tools=False) == "Hi"
    assert translator.decode_with_tool_awareness(ids, has_tools=True) == "\x01Hi"


def test_a_parser_we_cannot_load_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="'no_such_parser'"):
        ToolCallTranslator(ChatCharTokenizer(), parser_name="no_such_parser")
    monkeypatch.setattr(tool_call_translator, "_vllm_classes", lambda: None)
    with pytest.raises(ConfigError, match="needs vLLM's tool parsers"):
        ToolCallTranslator(ChatCharTokenizer(), parser_name="llama3_json")


class RefusingParser:
    def __init__(self, tokenizer: Any) -> None:
        raise RuntimeError("no <tool_call> token in the vocabulary")


class RefusingManager:
    @staticmethod
    def get_tool_parser(name: str) -> type[RefusingParser]:
        return RefusingParser


def test_a_vllm_parser_that_refuses_the_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        tool_call_translator, "_vllm_classes", lambda: {"ToolParserManager": RefusingManager}
    )
    hermes = ToolCallTranslator(ChatCharTokenizer(), parser_name="hermes")
    assert hermes.parser is None, "hermes falls back to ours"
    assert hermes.parse_model_output(CALL, "auto", TOOLS)[2] == "tool_calls"
    with pytest.raises(ConfigError, match="refuses this tokenizer: no <tool_call> token"):
        ToolCallTranslator(ChatCharTokenizer(), parser_name="mistral")
