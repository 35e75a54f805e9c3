"""Types environment authors import (kept at the Atropos 0.4 path)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

Item = Any
"""Whatever ``get_next_item`` hands to ``collect_trajectories``: a dataset row, a seed, ..."""

UUID = str
number = int | float

Role = Literal["system", "user", "assistant", "tool", "agent"]


class Message(TypedDict):
    """One chat message; ``reward`` is optional and only some environments set it."""

    role: Role | str
    content: Any
    reward: NotRequired[float | None]


__all__ = ["UUID", "Item", "Message", "Role", "number"]
