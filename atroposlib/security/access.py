"""Who may reach a server of ours: the settings every server shares, checked at start-up.

Broker, inference server and proxy each declare these fields once by inheriting
:class:`AccessSettings`; :func:`mount_guard` puts the browser guard (and CORS) on the app.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import CliImplicitFlag

from atroposlib.security.guard import BrowserGuard, BrowserGuardMiddleware, is_loopback
from atroposlib.security.keys import non_empty_key

logger = logging.getLogger(__name__)


class AccessSettings(BaseModel):
    """The access fields of every server (``--host``, ``--api-key``, ``--admin-api-key`` ...)."""

    host: str = Field(
        default="127.0.0.1",
        description="Interface to listen on; 0.0.0.0 (other hosts) needs --api-key "
        "or --insecure-no-key.",
    )
    api_key: str | None = Field(
        default=None,
        description="When set, requests must send 'Authorization: Bearer <key>' (the inference "
        "server's and proxy's /health excepted); an empty value is an error. atropos-local and "
        "slurm/atropos.sbatch set one per run.",
    )
    admin_api_key: str | None = Field(
        default=None,
        description="When set, the routes that replace weights, pause generation, load LoRA "
        "adapters, hand out the trainer's batches or list everyone's sessions need this key "
        "instead of --api-key; it opens every other route too. Alone (no --api-key) it locks "
        "every route. Also read from ATROPOS_ADMIN_API_KEY, which launchers give to the servers "
        "and the trainer only.",
    )
    insecure_no_key: CliImplicitFlag[bool] = Field(
        default=False,
        description="Listen on a non-loopback --host without --api-key: anyone who can reach "
        "the port may use every route. Only on a network you alone use.",
    )
    cors_origins: list[str] = Field(
        default_factory=list,
        description="Browser origins allowed by CORS; empty means no cross-origin access.",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Without --api-key: host names clients may use in URLs besides IP addresses,"
        " localhost, single-label names and this machine's names ('*': any); other names are "
        "refused (403) as a browser's DNS-rebinding attempt.",
    )
    expose_api_docs: CliImplicitFlag[bool] = Field(
        default=False,
        description="Serve the OpenAPI schema (/openapi.json) and its pages (/docs, /redoc), "
        "behind --api-key when one is set; off by default.",
    )

    @field_validator("api_key", "admin_api_key")
    @classmethod
    def _key_not_empty(cls, value: str | None, info: ValidationInfo) -> str | None:
        return non_empty_key(value, str(info.field_name))

    @model_validator(mode="after")
    def _open_bind_is_explicit(self) -> Any:
        if not self.run_keys and not self.insecure_no_key and not is_loopback(self.host):
            raise ValueError(
                f"host {self.host!r} is reachable from other machines and no api_key is set: "
                "set --api-key (or the ATROPOS_API_KEY variable), bind 127.0.0.1, or pass "
                "--insecure-no-key to run it open on purpose"
            )
        return self

    @property
    def admin_key(self) -> str | None:
        """The key of the admin routes: ``admin_api_key``, else ``api_key``."""
        return self.admin_api_key or self.api_key

    @property
    def run_keys(self) -> tuple[str, ...]:
        """The keys of every other route: the run key and the admin key; ``()``: open."""
        return tuple(key for key in (self.api_key, self.admin_api_key) if key is not None)


def warn_if_open(settings: AccessSettings, server: str) -> None:
    """The loud warning of a server that listens beyond loopback without a key."""
    if not settings.run_keys and not is_loopback(settings.host):
        logger.warning(
            "!!! %s listens on %s WITHOUT an API key (--insecure-no-key): anyone who can reach "
            "its port can use every route (weights, sessions, the queue). Set --api-key. !!!",
            server, settings.host,
        )  # fmt: skip


def mount_guard(
    app: FastAPI, settings: AccessSettings, guard: BrowserGuard | None = None
) -> BrowserGuard:
    """Add CORS (when origins are listed) and, outside it, the browser guard; the guard."""
    guard = guard or BrowserGuard(settings)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
        )
    app.add_middleware(BrowserGuardMiddleware, guard=guard)
    return guard
