"""Settings of the broker process (``run-api``): flags, ``ATROPOS_*`` variables, defaults."""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from atroposlib.security.access import AccessSettings

logger = logging.getLogger(__name__)

MiB = 1024 * 1024
GiB = 1024 * MiB


class BrokerSettings(BaseSettings, AccessSettings):
    """Everything the broker can be told: each field is a ``--flag`` and an ``ATROPOS_*`` var."""

    model_config = SettingsConfigDict(env_prefix="ATROPOS_", extra="ignore")

    port: int = Field(default=8000, ge=0, le=65535, description="TCP port to listen on.")
    store: str = Field(
        default="sqlite:atropos_broker.sqlite3",
        description="Where queued groups live: 'sqlite:<path>' (durable) "
        "or 'memory' (lost on exit).",
    )
    sync_interval: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        description="Seconds between fsyncs of the sqlite store: a kill -9 loses nothing "
        "answered, a power loss at most the writes of this last interval.",
    )
    max_request_bytes: int = Field(
        default=64 * MiB, gt=0, description="Largest request body accepted as sent (413 above)."
    )
    max_inflated_bytes: int = Field(
        default=256 * MiB,
        gt=0,
        description="Largest request body accepted after gzip inflation (413 above).",
    )
    max_queued_groups: int = Field(
        default=100_000, gt=0, description="Queued groups past which posts get 503 + Retry-After."
    )
    max_queued_bytes: int = Field(
        default=8 * GiB,
        gt=0,
        description="Stored bytes of queued groups past which posts get 503 + Retry-After.",
    )
    min_free_bytes: int = Field(
        default=128 * MiB,
        ge=0,
        description="Free disk space the sqlite store keeps: new groups get 503 + Retry-After"
        " below it, so that acks and compaction can always write and free space.",
    )
    segment_bytes: int = Field(
        default=16 * MiB,
        ge=64 * 1024,
        le=GiB,
        description="Size at which the sqlite store's log starts a new segment file (a file is"
        " deleted once all its groups are acknowledged; smaller frees disk sooner).",
    )
    retain_delivered_batches: int = Field(
        default=8,
        ge=0,
        description="Delivered batches kept for re-delivery when the trainer never acknowledges.",
    )
    too_long_policy: Literal["reject", "drop"] = Field(
        default="reject",
        description="A sequence longer than the trainer's max_token_len: 'reject' answers 422, "
        "'drop' discards its group and counts it.",
    )
    stale_policy: Literal["drop", "reject"] = Field(
        default="drop",
        description="A group whose oldest sampled token is more than the trainer's "
        "max_staleness steps old: 'drop' discards it from the queue and counts it, 'reject' "
        "also answers 422 when it is posted already that old.",
    )
    recent_groups_kept: int = Field(
        default=64, ge=0, description="Accepted groups kept for GET /recent_groups."
    )
    gzip_level: int = Field(
        default=1,
        ge=1,
        le=9,
        description="gzip level of JSON responses of 1000 bytes or more (igzip: 1-3 -> its"
        " level 1, 4-6 -> 2, 7-9 -> 3).",
    )
    retry_after_seconds: int = Field(
        default=2, ge=1, description="Retry-After sent with 503 when the queue is full."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Logging level of the broker process."
    )

    @field_validator("store")
    @classmethod
    def _store_is_known(cls, value: str) -> str:
        if value == "memory" or (value.startswith("sqlite:") and len(value) > len("sqlite:")):
            return value
        raise ValueError(
            f"unknown store {value!r}; use 'memory' or 'sqlite:<path>' (e.g. sqlite:broker.db)"
        )
