"""Atropos 0.4's tool-call helpers: ``<tool_call>{json}</tool_call>`` to (name, arguments)."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from atroposlib.errors import ModelOutputError
from atroposlib.utils.bounded_json import loads_model_output, loads_python_literal

logger = logging.getLogger(__name__)

ERROR_TOOL_NAME = "-ERROR-"


def extract_tool_call(text: str, preferred_tags: Sequence[str] | None = None) -> str | None:
    """The stripped content of the first ``<tag>…</tag>`` block of the first tag that has one.

    >>> extract_tool_call('x <tool_call> {"name": "f"} </tool_call>')
    '{"name": "f"}'
    >>> extract_tool_call("no call") is None
    True
    """
    for tag in preferred_tags or ["tool_call"]:
        found = re.findall(f"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, re.DOTALL)
        if found:
            return str(found[0]).strip()
    return None


def _tool_names(tools: Sequence[Any]) -> set[str]:
    names = set()
    for tool in tools:
        if isinstance(tool, dict):
            function = tool.get("function")
            name = tool.get("name") or (
                function.get("name") if isinstance(function, dict) else None
            )
            if name:
                names.add(name)
    return names


def _decode_call(content: str) -> Any:
    """The call as JSON; else as a Python dict; else with single quotes read as double quotes
    (Atropos 0.4's only reading, kept for ``{'name': 'f', 'arguments': {'x': true}}``)."""
    try:
        return loads_model_output(content, strict=False)
    except ModelOutputError:
        pass
    try:
        return loads_python_literal(content)
    except ModelOutputError:
        return loads_model_output(content.replace("'", '"'), strict=False)


def parse_tool_call(
    response: str,
    available_tools: Sequence[Any] | None = None,
    preferred_tags: Sequence[str] | None = None,
) -> tuple[str, dict[str, Any], bool]:
    """``(tool_name, arguments, is_error)`` of the first tool call in ``response``.

    The call is read as JSON first, so an apostrophe in an argument stays one (Atropos 0.4
    turned every ``'`` into ``"`` before parsing and answered its error: its issue #478); a
    Python dict (``{'name': 'f'}``) is read too. A missing or unparsable call, or a name not
    among ``available_tools``, gives ``("-ERROR-", ..., True)``.

    >>> parse_tool_call('''<tool_call>{"name": "f", "arguments": {"q": "what's up"}}</tool_call>''')
    ('f', {'q': "what's up"}, False)
    >>> parse_tool_call("<tool_call>{'name': 'add', 'arguments': {'a': 1}}</tool_call>")
    ('add', {'a': 1}, False)
    >>> parse_tool_call('<tool_call>{"name": "rm"}</tool_call>', [{"name": "add"}])
    ('-ERROR-', {}, True)
    >>> parse_tool_call("just text")
    ('-ERROR-', {}, True)
    """
    content = extract_tool_call(response, preferred_tags)
    if not content:
        logger.debug("no tool call in response: %.200s", response)
        return ERROR_TOOL_NAME, {}, True
    try:
        call = _decode_call(content)
    except ModelOutputError as error:
        logger.debug("unparsable tool call %.200s: %s", content, error)
        return ERROR_TOOL_NAME, {}, True
    if not isinstance(call, dict):
        return ERROR_TOOL_NAME, {}, True
    name, arguments = call.get("name", ""), call.get("arguments", {})
    if not isinstance(name, str):
        return ERROR_TOOL_NAME, {}, True
    if available_tools and (not name or name not in _tool_names(available_tools)):
        return ERROR_TOOL_NAME, arguments, True
    return name, arguments, False
