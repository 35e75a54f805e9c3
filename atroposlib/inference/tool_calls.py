"""Tools on ``/v1/chat/completions``, as vLLM serves them: ``tools`` go to the chat template,
and with a ``tool_call_parser`` configured a reply's calls come back as OpenAI ``tool_calls``
(``finish_reason: "tool_calls"``), its text before the first call as ``content``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from atroposlib.envs.hermes import parse_tool_calls
from atroposlib.protocol import ChatMessageOut

Parser = Callable[[str], tuple[str | None, list[dict[str, Any]]]]

PARSERS: dict[str, Parser] = {
    "hermes": lambda text: parse_tool_calls(text, allow_unclosed=True),
}
"""Parser name (the server's ``tool_call_parser``) -> text -> (content, tool_calls)."""


def template_message(message: dict[str, Any]) -> dict[str, Any]:
    """A past assistant message's ``tool_calls`` with JSON-string arguments decoded, as chat
    templates expect them (vLLM does the same).

    >>> template_message({"role": "assistant", "tool_calls": [
    ...     {"function": {"name": "f", "arguments": '{"x": 1}'}}]})["tool_calls"][0]
    {'function': {'name': 'f', 'arguments': {'x': 1}}}
    """
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return message
    return {**message, "tool_calls": [_decoded_arguments(call) for call in calls]}


def _decoded_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call  # not JSON: the template gets the text as it is
    return {**call, "function": {**function, "arguments": arguments}}


def reply_message(
    text: str, parser_name: str | None, tools: list[dict[str, Any]] | None, tool_choice: Any
) -> ChatMessageOut:
    """The assistant message of one reply: its calls parsed when the request had ``tools``,
    ``tool_choice`` is not ``"none"`` and the server has a parser; else the text.

    >>> reply_message('Hi<tool_call>{"name": "f"}</tool_call>', "hermes", [{}], None).content
    'Hi'
    >>> reply_message('<tool_call>{"name": "f"}</tool_call>', None, [{}], None).tool_calls
    []
    """
    if parser_name is None or not tools or tool_choice == "none":
        return ChatMessageOut(content=text)
    content, calls = PARSERS[parser_name](text)
    return ChatMessageOut(content=content if calls else text, tool_calls=calls)
