"""What the wire protocols share: the request base, content types and sampling value types."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from atroposlib.bounds import INT32_MAX

JSON_CONTENT_TYPE = "application/json"
MSGPACK_CONTENT_TYPE = "application/msgpack"


class Body(BaseModel):
    """Request bodies: unknown keys are ignored, as Atropos did."""

    model_config = ConfigDict(extra="ignore")


TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1, description="Any int64.")]
STOP_LIST_MAX = 64
Stop = str | TokenId | Annotated[list[str | TokenId], Field(max_length=STOP_LIST_MAX)]
"""Stop strings, token ids (as Atropos environments send ``[eos_token_id]``), or a mix."""
