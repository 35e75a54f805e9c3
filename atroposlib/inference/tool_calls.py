"""Tools on ``/v1/chat/completions``, as vLLM serves them: ``tools`` go to the chat template,
and with a ``tool_call_parser`` configured a reply's calls come back as OpenAI ``tool_calls``
(``finish_reason: "tool_calls"``), its text before the first call as ``content``. Streamed,
text that may be the start of a call is held back and each call is sent whole, as a
``delta.tool_calls`` entry, once its block is closed (or the reply ends).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from atroposlib.envs.hermes import parse_tool_calls
from atroposlib.errors import ModelOutputError
from atroposlib.utils.bounded_json import loads_model_output
from atroposlib.wire.openai import ChatMessageOut


@dataclass(frozen=True)
class ToolCallFormat:
    """How one parser finds calls: the markers around a call and text -> (content, calls)."""

    start: str
    end: str
    parse: Callable[[str], tuple[str | None, list[dict[str, Any]]]]


PARSERS: dict[str, ToolCallFormat] = {
    "hermes": ToolCallFormat(
        "<tool_call>", "</tool_call>", lambda text: parse_tool_calls(text, allow_unclosed=True)
    ),
}
"""Parser name (the server's ``tool_call_parser``) -> its format."""


def chosen_format(
    parser_name: str | None, tools: list[dict[str, Any]] | None, tool_choice: Any
) -> ToolCallFormat | None:
    """The format to parse a reply with: none unless the request has ``tools``, its
    ``tool_choice`` is not ``"none"`` and the server has a parser."""
    if parser_name is None or not tools or tool_choice == "none":
        return None
    return PARSERS[parser_name]


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
        arguments = loads_model_output(function["arguments"])
    except ModelOutputError:
        return call  # not JSON (or too deep, too large): the template gets the text as it is
    return {**call, "function": {**function, "arguments": arguments}}


def reply_message(text: str, calls_format: ToolCallFormat | None) -> ChatMessageOut:
    """The assistant message of one reply: its calls parsed with ``calls_format``, if any.

    >>> reply_message('Hi<tool_call>{"name": "f"}</tool_call>', PARSERS["hermes"]).content
    'Hi'
    >>> reply_message('<tool_call>{"name": "f"}</tool_call>', None).tool_calls
    []
    """
    if calls_format is None:
        return ChatMessageOut(content=text)
    content, calls = calls_format.parse(text)
    return ChatMessageOut(content=content if calls else text, tool_calls=calls)


class StreamedCalls:
    """One streamed reply split into content pieces and whole calls as its text arrives.

    Content is the text before the first call, as written (the unstreamed ``content`` is the
    same text stripped); a reply whose blocks hold no call streams all of its text as content.

    >>> reply = StreamedCalls(PARSERS["hermes"])
    >>> reply.push("Let me look.<tool", finished=False)
    ('Let me look.', [])
    >>> reply.push('_call>{"name": "f", "arguments": {}}</tool_call>', finished=False)[1][0][
    ...     "function"]
    {'name': 'f', 'arguments': '{}'}
    >>> reply.push("", finished=True), reply.called
    (('', []), True)
    """

    def __init__(self, calls_format: ToolCallFormat) -> None:
        self._format = calls_format
        self._text = ""
        self._sent = 0
        self._calls = 0

    @property
    def called(self) -> bool:
        return self._calls > 0

    def push(self, piece: str, *, finished: bool) -> tuple[str, list[dict[str, Any]]]:
        """(content to send, calls to send, numbered with ``index``) after ``piece``."""
        self._text += piece
        start = self._text.find(self._format.start)
        if finished:
            calls = self._format.parse(self._text)[1]
            content_end = start if calls else len(self._text)
        else:
            closed = self._text.rfind(self._format.end)
            calls = self._format.parse(self._text[: closed + len(self._format.end)])[1]
            calls = calls if closed >= 0 else []
            content_end = start if start >= 0 else len(self._text) - self._open_tail()
        content = self._text[self._sent : max(content_end, self._sent)]
        self._sent = max(content_end, self._sent)
        new = [{"index": i, **call} for i, call in enumerate(calls) if i >= self._calls]
        self._calls = max(self._calls, len(calls))
        return content, new

    def _open_tail(self) -> int:
        """Length of the longest end of the text that may begin the start marker."""
        start = self._format.start
        for size in range(min(len(start) - 1, len(self._text)), 0, -1):
            if start.startswith(self._text[-size:]):
                return size
        return 0
