"""``view-run``: browse scored groups from a live broker (read-only) or JSONL dumps.

    view-run --api-url http://localhost:8000 --tokenizer MODEL     # the broker's recent groups
    view-run --input groups.jsonl --tokenizer MODEL                # env ``process`` dumps

Serves on 127.0.0.1 only (reach it from elsewhere with an SSH tunnel); no share link. Pages of
other sites (cross-site requests, DNS rebinding) are refused; with ``--viewer-key`` the page
asks for the key first, so other users of the machine cannot read the groups either.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from atroposlib.bounds import INT32_MAX
from atroposlib.export.text import Decoder
from atroposlib.security.keys import non_empty_key
from atroposlib.utils.cli import exit_with_error, parse_command_line
from atroposlib.utils.cli_settings import BrokerClientSettings

PROG = "view-run"


class ViewRunSettings(BrokerClientSettings):
    """Where the groups come from and where the app listens (always 127.0.0.1)."""

    model_config = SettingsConfigDict(env_prefix="ATROPOS_VIEW_", extra="forbid")

    input: list[str] = Field(
        default_factory=list,
        description="Show the groups of this JSONL dump instead of a broker's; repeatable.",
    )
    api_url: str = Field(
        default="http://localhost:8000",
        description="Broker to read recent groups from (GET /recent_groups only).",
    )
    api_key: str | None = Field(
        default=None,
        description="Bearer token of the broker, when it requires one (or ATROPOS_API_KEY).",
    )
    limit: int = Field(
        default=64, gt=0, le=INT32_MAX, description="How many recent groups to fetch."
    )
    tokenizer: str | None = Field(
        default=None,
        description="Tokenizer (hub name or folder) to show tokens as text; without it the "
        "viewer shows token ids.",
    )
    port: int = Field(default=7860, ge=0, le=65535, description="Port on 127.0.0.1 to serve on.")
    viewer_key: str | None = Field(
        default=None,
        description="When set, the page asks for it (any user name, this key as password) "
        "before showing anything; this viewer's own key, not read from ATROPOS_API_KEY (that "
        "is --api-key, the broker's). Without it anyone on this machine can read the groups.",
    )

    @field_validator("viewer_key")
    @classmethod
    def _viewer_key_not_empty(cls, value: str | None) -> str | None:
        return non_empty_key(value, "viewer_key", "ATROPOS_VIEW_VIEWER_KEY")


def _decoder(name: str | None) -> Decoder | None:
    if name is None:
        return None
    from transformers import AutoTokenizer

    try:
        tokenizer: Decoder = AutoTokenizer.from_pretrained(name)  # type: ignore[assignment]
    except (OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        exit_with_error(PROG, f"--tokenizer {name}: cannot load it ({reason})")
    return tokenizer


def parse_settings(argv: Sequence[str] | None = None) -> ViewRunSettings:
    return parse_command_line(
        ViewRunSettings,
        argv,
        PROG,
        description="Browse scored groups from a broker or JSONL dumps.",
    )


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_settings(argv)
    logging.basicConfig(level=logging.WARNING, format="view-run: %(message)s")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    missing = [path for path in settings.input if path != "-" and not os.path.isfile(path)]
    if missing:
        exit_with_error(PROG, f"--input {missing[0]}: no such file")
    decoder = _decoder(settings.tokenizer)

    from atroposlib.viewer.app import LOCALHOST, build_app, launch
    from atroposlib.viewer.data import broker_loader, file_loader

    if settings.input:
        load = file_loader(settings.input)
        source = ", ".join(settings.input)
    else:
        load = broker_loader(settings.api_url, settings.api_key, settings.limit)
        source = f"broker {settings.api_url}"
    print(f"view-run: serving {source} on http://{LOCALHOST}:{settings.port}", flush=True)
    if settings.viewer_key is None:
        print(
            "view-run: no --viewer-key: any user of this machine can read the groups "
            "(other sites' pages are refused)",
            flush=True,
        )
    launch(build_app(load, decoder, source), settings.port, key=settings.viewer_key)


if __name__ == "__main__":
    main()
