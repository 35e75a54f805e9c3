"""Which sources a command's settings read, besides its flags (``parse_command_line``).

``CommandLineSettings``: the command line only (``atropos-sandbox-check``, the SLURM planner,
``eval_runner``). ``BrokerClientSettings``: the tool's own variables (``ATROPOS_EXPORT_*``,
``ATROPOS_VIEW_*``), then the run's shared ``ATROPOS_API_KEY`` for ``api_key``.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


class CommandLineSettings(BaseSettings):
    """Settings of a command that reads its command line only: no environment variable, no
    file (``parse_command_line`` puts the flags in front of these sources)."""

    model_config = SettingsConfigDict(extra="forbid", cli_implicit_flags="toggle")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


SHARED_API_KEY = "ATROPOS_API_KEY"  # the broker's key, shared by every process of a run


class SharedApiKey(PydanticBaseSettingsSource):
    """``api_key`` from ``ATROPOS_API_KEY``: a settings class lists it after its own variables,
    so ``--api-key`` and ``<PREFIX>API_KEY`` win over the run's shared key."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        value = os.environ.get(SHARED_API_KEY) if field_name == "api_key" else None
        return value, field_name, False

    def __call__(self) -> dict[str, Any]:
        value = os.environ.get(SHARED_API_KEY)
        return {} if value is None else {"api_key": value}


class BrokerClientSettings(BaseSettings):
    """Settings of a tool that reads from the broker: its ``api_key`` falls back to
    ``ATROPOS_API_KEY`` below the tool's own variable."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            env_settings,
            dotenv_settings,
            file_secret_settings,
            SharedApiKey(settings_cls),
        )
