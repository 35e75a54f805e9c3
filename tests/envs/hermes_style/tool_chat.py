"""A chat that makes the 135M test model call a tool, greedily: the hermes-style template
(``hermes_tools.jinja``) and a few earlier turns in which the assistant answered every
"Search for X." with one ``search`` call (the model copies the pattern)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TEMPLATE = Path(__file__).with_name("hermes_tools.jinja")
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]


def _call(query: str) -> dict[str, Any]:
    function = {"name": "search", "arguments": json.dumps({"q": query})}
    call = {"id": f"call_{query}", "type": "function", "function": function}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def few_shot(query: str) -> list[dict[str, Any]]:
    """Earlier turns (each query searched twice), then the user asking to search ``query``."""
    messages: list[dict[str, Any]] = []
    for earlier in ("cats", "dogs", "fish"):
        messages += [
            {"role": "user", "content": f"Search for {earlier}."}, _call(earlier),
            {"role": "tool", "tool_call_id": f"call_{earlier}", "content": "ok"},
            {"role": "user", "content": "Again."}, _call(earlier),
        ]  # fmt: skip
    return [*messages, {"role": "user", "content": f"Search for {query}."}]
