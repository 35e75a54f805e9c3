"""Numeric bounds of the wire contract (422 past them): steps, sizes, names.

Kept apart from the wire models (:mod:`atroposlib.wire`) so that :mod:`atroposlib.group`, which
the broker's wire module re-exports, can use them too.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

MAX_STEP = 2**53 - 1
"""Largest step, policy version or env id accepted: exact in every JSON parser, and far enough
below SQLite's int64 that the steps the broker counts on from it never overflow."""
INT32_MAX = 2**31 - 1
MAX_WEIGHT = 1e9
MAX_NAME_CHARS = 1024
MAX_PATH_CHARS = 4096

Step = Annotated[int, Field(ge=0, le=MAX_STEP)]
SignedStep = Annotated[int, Field(ge=-MAX_STEP, le=MAX_STEP)]
Count = Annotated[int, Field(gt=0, le=INT32_MAX)]
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
