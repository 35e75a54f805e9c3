"""Options of ``atropos-sft-gen`` and ``atropos-dpo-gen`` (Atropos's flags, plus a few of ours).

Each field is a ``--kebab-case`` flag whose help is its description (``filepath`` is the
positional argument); ``ATROPOS_EXPORT_<FIELD>`` environment variables fill what the command line
leaves out (``api_key`` also reads ``ATROPOS_ADMIN_API_KEY``, else ``ATROPOS_API_KEY``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Self

from pydantic import Field, model_validator
from pydantic_settings import CliPositionalArg, SettingsConfigDict

from atroposlib.bounds import INT32_MAX
from atroposlib.utils.cli_settings import BrokerClientSettings

logger = logging.getLogger(__name__)


class ExportSettings(BrokerClientSettings):
    """Options shared by both exporters (``filepath`` is the positional argument)."""

    takes_batches = True

    model_config = SettingsConfigDict(
        env_prefix="ATROPOS_EXPORT_", extra="forbid", cli_implicit_flags="toggle"
    )

    filepath: CliPositionalArg[Path] = Field(
        description="Output JSONL file (refused if it exists, unless appending)."
    )
    input: list[str] = Field(
        default_factory=list,
        description="Read groups from this JSONL dump (env 'process' output; '-' for stdin) "
        "instead of a live broker; repeat for several files.",
    )
    api_url: str = Field(
        default="http://localhost:8000", description="Base URL of the broker to read from."
    )
    api_key: str | None = Field(
        default=None,
        description="Bearer token of the broker, when it requires one (default: "
        "ATROPOS_ADMIN_API_KEY, else ATROPOS_API_KEY; taking batches needs the admin key).",
    )
    group_size: int = Field(
        default=2,
        gt=0,
        le=INT32_MAX,
        description="Sequences per group sent by the envs (sets the batch size).",
    )
    tasks_per_step: int = Field(
        default=64,
        gt=0,
        le=INT32_MAX,
        description="Groups per batch pulled from the broker: "
        "batch_size = group_size * tasks_per_step.",
    )
    max_token_len: int = Field(
        default=2048,
        gt=0,
        le=INT32_MAX,
        description="Longest sequence accepted; longer ones are skipped.",
    )
    tokenizer: str | None = Field(
        default=None,
        description="Tokenizer (hub name or folder) of the model that generated the tokens; "
        "needed to decode prefix/completion text (not with --save-messages).",
    )
    save_messages: bool = Field(
        default=False, description="Save the chats (group 'messages') instead of decoded text."
    )
    num_seqs_to_save: int = Field(
        default=100, gt=0, le=INT32_MAX, description="Stop after writing this many lines."
    )
    allow_negative_scores: bool = Field(
        default=False,
        description="Also keep sequences scoring zero or below (by default only positive "
        "scores are kept as SFT targets or DPO chosen answers).",
    )
    minimum_score_diff_max_min: float = Field(
        default=0.0,
        ge=0,
        allow_inf_nan=False,
        description="SFT: keep a sequence only if it "
        "scores at least this much above its group's lowest score (0 = off).",
    )
    append_to_previous: bool = Field(
        default=False, description="Append to an existing output file instead of refusing it."
    )
    reset_broker: bool = Field(
        default=False,
        description="Empty the broker's queue (GET /reset_data) before reading. Discards "
        "every env's queued data; never done unless this flag is given.",
    )
    idle_timeout: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Stop when the broker had no batch for this many seconds "
        "(default: wait for more data until the line target is reached).",
    )
    poll_interval: float = Field(
        default=1.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds between GET /batch polls while the broker has no batch.",
    )
    quiet: bool = Field(default=False, description="No progress bar; only the final summary.")
    dry_run: bool = Field(
        default=False,
        description="Check the tokenizer and the source (dumps valid, broker reachable), then "
        "exit; registers nothing, resets nothing, writes nothing.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if not self.save_messages and not self.tokenizer:
            raise ValueError(
                "--tokenizer is required to decode tokens into text; pass the generating "
                "model's tokenizer (hub name or folder), or use --save-messages"
            )
        if self.batch_size > INT32_MAX:
            raise ValueError(
                f"--group-size x --tasks-per-step = {self.batch_size} sequences per batch is "
                f"more than the broker accepts ({INT32_MAX}); lower one of them"
            )
        if self.dry_run and self.reset_broker:
            raise ValueError("--dry-run changes nothing, so it cannot --reset-broker; drop one")
        if self.input and self.reset_broker:
            raise ValueError(
                "--reset-broker only applies when reading from a broker; drop it or drop --input"
            )
        return self

    @property
    def batch_size(self) -> int:
        return self.group_size * self.tasks_per_step


class SftSettings(ExportSettings):
    """SFT lines (rejection sampling); ``filepath`` is the positional output path."""

    save_top_n_per_group: int = Field(
        default=3,
        gt=0,
        le=INT32_MAX,
        description="Keep at most this many of each group's best sequences.",
    )


class DpoSettings(ExportSettings):
    """DPO pairs (best vs worst); ``filepath`` is the positional output path."""

    save_n_pairs_per_group: int = Field(
        default=3,
        gt=0,
        le=INT32_MAX,
        description="Make at most this many (chosen, rejected) pairs per group.",
    )
    minimum_score_diff_max_min: float = Field(
        default=0.5,
        ge=0,
        allow_inf_nan=False,
        description="Pair two sequences only if the "
        "chosen one scores at least this much above the rejected one.",
    )
