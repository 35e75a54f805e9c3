"""Engines' weight version labels read as trainer steps: one per reply, or one per token from
vLLM-style spans."""

from __future__ import annotations

from typing import Any

from atroposlib.errors import InferenceError

STARTUP_LABEL = "default"
"""vLLM's and SGLang's label for the weights they were started with, until a push names a
version: the run's step 0 (a restarted vLLM is labelled with its step by ``VllmRestart``)."""


def weight_version(value: Any) -> int | None:
    """An engine's weight version as an int (vLLM and SGLang send strings; ``"default"``, their
    start-up weights, is step 0; a label that names no step is unknown).

    >>> weight_version(3), weight_version("12"), weight_version("default"), weight_version("base")
    (3, 12, 0, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if value == STARTUP_LABEL:
        return 0
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def token_versions(spans: Any, length: int) -> list[int] | None:
    """Each output token's weight version from vLLM-style spans (``[{version, start, end}]``).

    >>> token_versions([{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2,
    ...     "end": 3}], 3)
    [3, 3, 4]
    >>> token_versions(None, 5) is None
    True
    """
    if spans is None:
        return None
    out: list[int] = []
    try:
        for span in spans:
            version, start, end = weight_version(span["version"]), span["start"], span["end"]
            if version is None or start != len(out) or end < start:
                raise ValueError(span)
            out += [version] * (end - start)
    except (KeyError, TypeError, ValueError) as exc:
        raise InferenceError(f"weight_versions spans are malformed: {str(spans)[:200]}") from exc
    if len(out) != length:
        raise InferenceError(f"weight_versions cover {len(out)} tokens, the output has {length}")
    return out
