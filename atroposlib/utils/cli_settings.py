"""Which sources a command's settings read, besides its flags (``parse_command_line``).

``CommandLineSettings``: the command line only (``atropos-sandbox-check``, the SLURM planner,
``eval_runner``). ``BrokerClientSettings``: the tool's own variables (``ATROPOS_EXPORT_*``,
``ATROPOS_VIEW_*``), then the run's key ``ATROPOS_API_KEY`` for ``api_key``; a tool that takes
batches (an admin route) reads the admin key ``ATROPOS_ADMIN_API_KEY`` first.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

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


SHARED_API_KEY = "ATROPOS_API_KEY"  # the run key, shared by every process of a run
SHARED_ADMIN_API_KEY = "ATROPOS_ADMIN_API_KEY"  # the admin key: servers and the trainer only
_SHARED = {"api_key": SHARED_API_KEY, "admin_api_key": SHARED_ADMIN_API_KEY}


class SharedApiKey(PydanticBaseSettingsSource):
    """``api_key`` from ``ATROPOS_API_KEY`` and, for a class with an ``admin_api_key`` field,
    that field from ``ATROPOS_ADMIN_API_KEY``: a settings class lists this source after its own
    variables, so ``--api-key`` and ``<PREFIX>API_KEY`` win over the run's shared keys."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        variable = _SHARED.get(field_name)
        return (os.environ.get(variable) if variable else None), field_name, False

    def __call__(self) -> dict[str, Any]:
        fields = self.settings_cls.model_fields
        return {
            name: value
            for name, variable in _SHARED.items()
            if name in fields and (value := os.environ.get(variable)) is not None
        }


class BatchReaderApiKey(SharedApiKey):
    """``api_key`` of a tool that takes batches from the broker (an admin route, as the
    trainer's): ``ATROPOS_ADMIN_API_KEY`` when set, else ``ATROPOS_API_KEY``."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self().get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        key = os.environ.get(SHARED_ADMIN_API_KEY) or os.environ.get(SHARED_API_KEY)
        return (
            {"api_key": key}
            if key is not None and "api_key" in self.settings_cls.model_fields
            else {}
        )


class BrokerClientSettings(BaseSettings):
    """Settings of a tool that reads from the broker: its ``api_key`` falls back to
    ``ATROPOS_API_KEY`` below the tool's own variable; with ``takes_batches`` (an admin
    route) to ``ATROPOS_ADMIN_API_KEY`` first."""

    takes_batches: ClassVar[bool] = False

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
            (BatchReaderApiKey if cls.takes_batches else SharedApiKey)(settings_cls),
        )
