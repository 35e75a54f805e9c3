"""Optional group fields in a shape the typed group does not take: normalised or set aside.

Atropos wrote an env's group dict as it came, so Atropos envs fill the per-sequence
``messages`` in other shapes: one conversation for the whole group, or one rendered string per
sequence. Nothing trains on ``messages`` or ``extra``, so a group must not be lost over them:
a shape whose meaning is unambiguous becomes one entry per sequence, any other is set aside
(the group goes on without it) with one warning per field per run naming the shape expected.
Fields the trainer reads (tokens, masks, scores, advantages, logprobs, overrides,
finish_reasons, generation_params, ...) stay strict: a group with one of them malformed is
still rejected, here and by the broker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import JsonValue, TypeAdapter, ValidationError

from atroposlib.group import Message

logger = logging.getLogger(__name__)

TEXT_ROLE = "text"
"""Role of a message made from a bare string (a rendered transcript: no single speaker)."""

EXPECTED_SHAPES: dict[str, str] = {
    "messages": "one list of {role, content} messages per sequence",
    "extra": "one JSON object per sequence",
}
"""The fields a group may lose rather than be rejected over, and the shape each should have."""

_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    "messages": TypeAdapter(list[list[Message]]),
    "extra": TypeAdapter(list[dict[str, JsonValue]]),
}

ONE_CONVERSATION = "one conversation for the whole group, given to each sequence"
ONE_STRING = "one string for the whole group, given to each sequence as a text message"
BARE_TEXT = f"text, not {{role, content}} messages: each string made a {TEXT_ROLE!r} message"
ONE_OBJECT = "one object for the whole group, given to each sequence"

Normalised = tuple[Any, str] | None
"""A field's value as one entry per sequence and how it was read, or ``None``: ambiguous."""


def _text(content: str) -> dict[str, str]:
    return {"role": TEXT_ROLE, "content": content}


def _is_message(value: Any) -> bool:
    return isinstance(value, Mapping) and "role" in value and "content" in value


def _normalise_messages(value: Any, size: int) -> Normalised:
    if isinstance(value, str):
        return [[_text(value)] for _ in range(size)], ONE_STRING
    if not isinstance(value, list) or not value:
        return None
    if all(_is_message(m) for m in value):
        roles = {m["role"] for m in value}
        # G same-role messages for G sequences could as well be one reply per sequence
        if len(value) != size or size == 1 or len(roles) > 1:
            conversation = [dict(m) for m in value]
            return [list(conversation) for _ in range(size)], ONE_CONVERSATION
        return None
    if len(value) == size and all(isinstance(entry, str | list) for entry in value):
        per_sequence = []
        for entry in value:
            turns = [entry] if isinstance(entry, str) else entry
            if not all(isinstance(t, str) or _is_message(t) for t in turns):
                return None
            per_sequence.append([_text(t) if isinstance(t, str) else dict(t) for t in turns])
        return per_sequence, BARE_TEXT
    return None


def _normalise_extra(value: Any, size: int) -> Normalised:
    if isinstance(value, Mapping):
        return [dict(value) for _ in range(size)], ONE_OBJECT
    return None


_NORMALISERS: dict[str, Callable[[Any, int], Normalised]] = {
    "messages": _normalise_messages,
    "extra": _normalise_extra,
}


def _fits(name: str, value: Any, size: int) -> bool:
    if not isinstance(value, list) or len(value) != size:
        return False
    try:
        _ADAPTERS[name].validate_python(value)
    except ValidationError:
        return False
    return True


def describe_shape(value: Any) -> str:
    """A short description of a value's shape for a warning: ``a list of 3 str``, ``int``."""
    if isinstance(value, list):
        kinds = sorted({type(entry).__name__ for entry in value})
        return f"a list of {len(value)} {'/'.join(kinds) or 'entries'}"
    return type(value).__name__


@dataclass(frozen=True)
class Repaired:
    """A group with its lenient fields fixed, and what was done to each (field, note)."""

    group: dict[str, Any]
    normalised: list[tuple[str, str]]
    set_aside: list[tuple[str, str]]


def repair_optional_fields(group: Mapping[str, Any]) -> Repaired | None:
    """``group`` with ``messages`` / ``extra`` as one entry per sequence, or left out where
    their shape is ambiguous; ``None`` when neither needed it (the fault is elsewhere).

    >>> flat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    >>> fixed = repair_optional_fields({"scores": [1.0, 0.0], "messages": flat})
    >>> fixed.group["messages"] == [flat, flat], fixed.normalised
    (True, [('messages', 'one conversation for the whole group, given to each sequence')])
    """
    scores = group.get("scores")
    if not isinstance(scores, list):
        return None
    size = len(scores)
    fixed, normalised, set_aside = dict(group), [], []
    for name, normalise in _NORMALISERS.items():
        value = group.get(name)
        if value is None or (name == "messages" and value == []) or _fits(name, value, size):
            continue
        attempt = normalise(value, size)
        if attempt is not None and _fits(name, attempt[0], size):
            fixed[name] = attempt[0]
            normalised.append((name, attempt[1]))
        else:
            del fixed[name]
            set_aside.append((name, describe_shape(value)))
    if not normalised and not set_aside:
        return None
    return Repaired(fixed, normalised, set_aside)


@dataclass
class RepairNotices:
    """Says once per run, per field and kind of change, what repairs did to groups."""

    told: set[tuple[str, str]] = field(default_factory=set)

    def announce(self, repaired: Repaired) -> None:
        """Log what ``repaired`` changed, each field and kind of change once per run."""
        for name, how in repaired.normalised:
            if ("normalised", name) not in self.told:
                self.told.add(("normalised", name))
                logger.info("group field %r is %s (said once)", name, how)
        for name, shape in repaired.set_aside:
            if ("set aside", name) not in self.told:
                self.told.add(("set aside", name))
                logger.warning("group field %r set aside: expected %s, got %s; groups are kept "
                               "without it (said once)", name, EXPECTED_SHAPES[name],
                               shape)  # fmt: skip
