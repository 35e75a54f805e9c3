"""ManagedServer on a ServerHarness: nodes, masks, logprobs, multi-turn extension, tool calls
(with our hermes parser, so on a plain install)."""

from __future__ import annotations

from typing import Any

import pytest

from atroposlib.envs.server_handling import tool_call_translator
from atroposlib.envs.server_handling.managed_server import ManagedServer
from atroposlib.envs.server_handling.server_harness import ServerHarness
from atroposlib.errors import InferenceError
from tests.fakes import ChatCharTokenizer

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
CALL = '<tool_call>{"name": "search", "arguments": {"q": "cats"}}</tool_call>'


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


@pytest.fixture
def harness() -> ServerHarness:
    server = ServerHarness()
    server.tokenizer = ChatCharTokenizer()
    return server


@pytest.fixture(autouse=True)
def builtin_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our hermes parser, whether or not vLLM is installed here."""
    monkeypatch.setattr(tool_call_translator, "_vllm_classes", lambda: None)


def script(server: ServerHarness, prompt: str, prompt_ids: list[int], *replies: str) -> None:
    server.set_tokens_and_logprobs_response(
        prompt, prompt_ids, [ids(r) for r in replies], [[-0.5] * len(r) for r in replies],
        ["stop"] * len(replies),
    )  # fmt: skip


async def test_a_raw_prompt_gets_the_special_tokens_and_a_chat_prompt_does_not(
    harness: ServerHarness,
) -> None:
    managed = ManagedServer(harness)
    assert managed.tokenizer is harness.tokenizer
    await managed.completion(prompt="Hi", max_tokens=2)
    chat = [{"role": "user", "content": "Hi"}]
    await managed.chat_completion(messages=chat, max_tokens=2)
    raw, templated = managed.get_state()["nodes"]
    assert raw.tokens[:3] == [1, *ids("Hi")], "BOS, as /completions tokenizes a prompt"
    rendered = managed.render_prompt(chat)
    assert templated.tokens[: len(rendered)] == ids(rendered), "the template wrote the prompt"
    for node, prompt_length in ((raw, 3), (templated, len(rendered))):
        assert node.masked_tokens == [-100] * prompt_length + node.tokens[prompt_length:]
        assert node.logprobs == [1.0] * prompt_length + [-1.0] * 2


async def test_a_later_turn_extends_its_node_in_place_without_retokenizing(
    harness: ServerHarness,
) -> None:
    managed = ManagedServer(harness)
    script(harness, "Q", [1, *ids("Q")], "a", "b")
    await managed.completion(prompt="Q", n=2)
    first_a, first_b = managed.current_nodes
    script(harness, "Qa?", [*first_a.tokens, *ids("?")], "x", "y")
    reply = await managed.completion(prompt="Qa?", n=2)
    assert [c.text for c in reply.choices] == ["x", "y"]
    x, y, kept = managed.get_state()["nodes"]
    assert kept == first_b and x.full_text == "Qa?x" and y.full_text == "Qa?y"
    assert x.tokens == [1, *ids("Qa?x")]
    assert x.masked_tokens == [-100, -100, ord("a"), -100, ord("x")], "turn one stays trained"
    assert x.logprobs == [1.0, 1.0, -0.5, 1.0, -0.5]


async def test_track_tree_keeps_every_completion_as_a_node_keyed_by_its_text(
    harness: ServerHarness,
) -> None:
    """Atropos 0.4's tree mode: parents stay, each node trains only its own completion."""
    managed = ManagedServer(harness, track_tree=True)
    script(harness, "Q", [1, *ids("Q")], "a", "b")
    await managed.completion(prompt="Q", n=2)
    parent = managed.get_state()["sequences"]["Qa"]
    script(harness, "Qa?", [*parent.tokens, *ids("?")], "x")
    await managed.completion(prompt="Qa?")
    state = managed.get_state()
    assert set(state) == {"sequences", "tree"} and state["tree"] == state["sequences"]
    assert sorted(state["sequences"]) == ["Qa", "Qa?x", "Qb"], "the parent is kept"
    child = state["sequences"]["Qa?x"]
    assert child.tokens == [1, *ids("Qa?x")], "the parent's ids reused, not re-tokenized"
    assert child.masked_tokens == [-100] * 4 + [ord("x")] and child.logprobs == [1.0] * 4 + [-0.5]
    managed.reset()
    assert managed.get_state()["sequences"] == {}
    assert "track_tree" in ManagedServer.__init__.__code__.co_varnames[:4], "Atropos's order"


async def test_a_server_that_changes_the_conversation_ids_is_an_error(
    harness: ServerHarness,
) -> None:
    managed = ManagedServer(harness)
    script(harness, "Q", [1, *ids("Q")], "a")
    await managed.completion(prompt="Q")
    script(harness, "Qa!", ids("Qa!"), "b")
    with pytest.raises(InferenceError, match="re-tokenized"):
        await managed.completion(prompt="Qa!")


async def test_tool_calls_are_parsed_and_the_next_turn_extends_the_raw_reply(
    harness: ServerHarness,
) -> None:
    tokenizer = harness.tokenizer
    managed = ManagedServer(harness, tool_parser="hermes")
    chat = [{"role": "user", "content": "Find cats"}]
    first_prompt = tokenizer.apply_chat_template(chat, tools=TOOLS)
    script(harness, first_prompt, ids(first_prompt), f"Looking.{CALL}")
    reply = await managed.chat_completion(messages=chat, tools=TOOLS)
    [choice] = reply.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Looking."
    [call] = choice.message.tool_calls
    assert call["function"]["name"] == "search" and call.function.arguments == '{"q": "cats"}'
    [node] = managed.get_state()["nodes"]
    assert node.full_text == first_prompt + f"Looking.{CALL}", "the node keeps the raw text"

    chat += [
        {"role": "assistant", "content": "Looking.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "5 cats"},
    ]
    second_prompt = managed.render_prompt(chat, TOOLS)
    assert second_prompt.startswith(node.full_text)
    script(harness, second_prompt, ids(second_prompt), "Five.")
    reply = await managed.chat_completion(messages=chat, tools=TOOLS)
    assert reply.choices[0].message.content == "Five." and not reply.choices[0].message.tool_calls
    [extended] = managed.get_state()["nodes"]
    assert extended.masked_tokens[: len(node.tokens)] == node.masked_tokens


@pytest.mark.parametrize(
    ("parser", "tool_choice"), [("hermes", "none"), (None, "auto")], ids=["none", "no-parser"]
)
async def test_without_parsing_the_reply_is_its_text(
    harness: ServerHarness, parser: str | None, tool_choice: str
) -> None:
    managed = ManagedServer(harness, tool_parser=parser)
    chat = [{"role": "user", "content": "Hi"}]
    prompt = harness.tokenizer.apply_chat_template(chat, tools=TOOLS)
    script(harness, prompt, ids(prompt), CALL)
    reply = await managed.chat_completion(messages=chat, tools=TOOLS, tool_choice=tool_choice)
    assert reply.choices[0].message.content == CALL and reply.choices[0].finish_reason == "stop"


async def test_an_unknown_tool_parser_warns_once_and_parses_nothing(
    harness: ServerHarness,
) -> None:
    managed = ManagedServer(harness, tool_parser="llama3_json")
    with pytest.warns(UserWarning, match="needs vLLM's tool parsers"):
        assert managed._get_translator() is None
    assert managed._get_translator() is None


async def test_prompt_logprobs_of_a_chat_are_asked_for_its_template_ids(
    harness: ServerHarness,
) -> None:
    managed = ManagedServer(harness)
    asked: dict[str, Any] = {}

    async def get_logprobs(**kwargs: Any) -> dict[str, Any]:
        asked.update(kwargs)
        return {"prompt_tokens": kwargs["input_ids"]}

    with pytest.raises(NotImplementedError, match="does not implement get_logprobs"):
        await managed.get_logprobs(prompt="x")
    harness.get_logprobs = get_logprobs  # type: ignore[method-assign]
    chat = [{"role": "user", "content": "Hi"}]
    await managed.get_logprobs(messages=chat, top_k=2)
    rendered = managed.render_prompt(chat)
    assert asked == {"prompt": rendered, "input_ids": ids(rendered), "top_k": 2}
