"""Foreign chat messages as our chat template takes them.

verifiers hands the adapter OpenAI wire messages (content parts, ``tool_calls``) and tool
schemas; :func:`template_messages` makes plain messages of them for
:class:`~atroposlib.envs.trajectory.ChatTemplate`: string content, tool calls as Hermes text
when the template cannot render them, tools listed in the system prompt when it cannot render
``tools``. Sampling and trajectories are the shared token path (``atroposlib.envs.rollouts``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from atroposlib.envs.hermes import tool_calls_as_text, tools_prompt
from atroposlib.envs.trajectory import ChatTemplate
from atroposlib.type_definitions import Message


def _text(content: Any) -> str:
    """Message content as one string (text parts joined, None empty).

    >>> _text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]), _text(None)
    ('ab', '')
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))


def template_messages(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[list[Message], list[dict[str, Any]] | None]:
    """The messages (and the tools, if the template renders them) for ``template``."""
    chat: list[dict[str, Any]] = []
    for message in messages:
        plain: dict[str, Any] = {"role": message["role"], "content": _text(message.get("content"))}
        if message.get("tool_calls"):
            plain["tool_calls"] = list(message["tool_calls"])
            if not template.renders_tool_calls:
                plain = tool_calls_as_text(plain)
        if message.get("tool_call_id") is not None:
            plain["tool_call_id"] = message["tool_call_id"]
        chat.append(plain)
    if not tools:
        return cast(list[Message], chat), None
    if template.renders_tools:
        return cast(list[Message], chat), [dict(tool) for tool in tools]
    listing = tools_prompt(tools)
    if chat and chat[0]["role"] == "system":
        chat[0] = {**chat[0], "content": f"{chat[0]['content']}\n\n{listing}"}
    else:
        chat.insert(0, {"role": "system", "content": listing})
    return cast(list[Message], chat), None
