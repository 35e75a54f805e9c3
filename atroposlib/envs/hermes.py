"""Hermes-style tool calls as plain text: ``<tool_call>{"name": ..., "arguments": {...}}``.

For chat templates that cannot render ``tools`` or ``tool_calls`` themselves: the tool list
goes into the system prompt (``tools_prompt``), a reply's calls are parsed from its text
(``parse_tool_calls``) and a past assistant message's calls are written back as that text
(``tool_calls_as_text``).
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from atroposlib.errors import ModelOutputError
from atroposlib.utils.bounded_json import loads_model_output

TOOLS_PROMPT = (
    "You can call these tools:\n<tools>\n{tools}\n</tools>\n"
    'To call one, reply <tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call> '
    "(one block per call). Answer in plain text when no tool is needed."
)
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_TOOL_CALL_OR_UNCLOSED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)


def tools_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system-prompt text that lists ``tools`` (one JSON object a line).

    >>> print(tools_prompt([{"name": "f"}]).splitlines()[2])
    {"name": "f"}
    """
    return TOOLS_PROMPT.format(tools="\n".join(json.dumps(dict(tool)) for tool in tools))


def parse_tool_calls(
    text: str, *, allow_unclosed: bool = False
) -> tuple[str | None, list[dict[str, Any]]]:
    """(content before the first call, OpenAI ``tool_calls``) of ``<tool_call>{json}`` blocks;
    a block that is not a JSON object with a name is left in the content. ``allow_unclosed``:
    a last block without ``</tool_call>`` counts too (vLLM's hermes parser reads it).

    >>> content, calls = parse_tool_calls(
    ...     'Let me check.<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    >>> content, [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    ('Let me check.', [('f', '{"x": 1}')])
    >>> parse_tool_calls("<tool_call>{oops}</tool_call>")[1]
    []
    >>> len(parse_tool_calls('<tool_call>{"name": "f"}', allow_unclosed=True)[1])
    1
    """
    calls = []
    for block in (_TOOL_CALL_OR_UNCLOSED if allow_unclosed else _TOOL_CALL).findall(text):
        try:
            decoded = loads_model_output(block)
        except ModelOutputError:
            continue
        if not isinstance(decoded, dict) or not isinstance(decoded.get("name"), str):
            continue
        arguments = decoded.get("arguments", {})
        calls.append({
            "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": decoded["name"], "arguments": arguments if isinstance(
                arguments, str) else json.dumps(arguments)},
        })  # fmt: skip
    if not calls:
        return text, []
    content = text[: text.find("<tool_call>")].strip()
    return content or None, calls


def tool_calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message with ``tool_calls`` rewritten as the raw text the model wrote.

    >>> tool_calls_as_text({"role": "assistant", "content": "",
    ...     "tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1}'}}]})["content"]
    '<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>'
    """
    calls = message.get("tool_calls") or []
    if message.get("role") != "assistant" or not calls:
        return message
    blocks = []
    for call in calls:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            with contextlib.suppress(ModelOutputError):
                arguments = loads_model_output(arguments)
        call_json = json.dumps({"name": function.get("name"), "arguments": arguments})
        blocks.append(f"<tool_call>\n{call_json}\n</tool_call>")
    content = message.get("content") or ""
    text = "\n".join([content, *blocks] if content else blocks)
    return {k: v for k, v in {**message, "content": text}.items() if k != "tool_calls"}
