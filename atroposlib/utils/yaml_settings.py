"""The ``--config`` YAML layer of settings, shared by the env CLI and the trainer.

Precedence everywhere: command line > environment variable > YAML file > defaults. A settings
class that subclasses ``LayeredSettings`` reads init kwargs, then environment variables, then the
mapping given to ``yaml_layer(...)`` (pydantic-settings puts the CLI in front when it parses
one); no ``.env`` file and no secrets directory are read.
"""

from __future__ import annotations

import contextvars
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource

from atroposlib.errors import ConfigError

CONFIG_FLAG = "--config"
_YAML_LAYER: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "yaml_layer", default=None
)


def config_flag(argv: Sequence[str]) -> str | None:
    """The path given as ``--config PATH`` or ``--config=PATH`` in ``argv``, if any.

    >>> config_flag(["--lr", "1e-5", "--config", "run.yaml"]), config_flag(["--config=a.yaml"])
    ('run.yaml', 'a.yaml')
    """
    for index, arg in enumerate(argv):
        if arg == CONFIG_FLAG and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith(CONFIG_FLAG + "="):
            return arg.split("=", 1)[1]
    return None


def read_yaml_config(path: str | Path, *, keys: Collection[str] | None = None) -> dict[str, Any]:
    """The mapping in the YAML file ``path`` (``keys``: the top-level keys it may have).

    Raises ``ConfigError`` with a one-line reason: a missing file, invalid YAML, a file that
    does not hold a mapping, or an unknown top-level key.
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{CONFIG_FLAG}: file {path} does not exist; pass an existing YAML file")
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as err:
        reason = " ".join(str(err).split())
        raise ConfigError(f"{CONFIG_FLAG}: {path} is not valid YAML: {reason}") from err
    if not isinstance(data, dict):
        expected = f" with keys {', '.join(sorted(keys))}" if keys else " of settings"
        raise ConfigError(f"{CONFIG_FLAG}: {path} must hold a mapping{expected}")
    unknown = set(data) - set(keys) if keys is not None else set()
    if unknown:
        raise ConfigError(f"{CONFIG_FLAG}: unknown top-level keys {sorted(unknown)} in {path}")
    return data


@contextmanager
def yaml_layer(data: dict[str, Any] | None) -> Iterator[None]:
    """Settings built inside the block read ``data`` below environment variables."""
    token = _YAML_LAYER.set(data)
    try:
        yield
    finally:
        _YAML_LAYER.reset(token)


class LayeredSettings(BaseSettings):
    """Base of a process's settings: init kwargs > environment > ``yaml_layer`` > defaults.

    A subclass whose caller merges the sources itself (and passes the result as init kwargs)
    sets ``sources_merged_by_caller = True``; it then reads init kwargs only.
    """

    sources_merged_by_caller: ClassVar[bool] = False

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        if cls.sources_merged_by_caller:
            return (init_settings,)
        data = _YAML_LAYER.get()
        if not data:
            return (init_settings, env_settings)
        return (init_settings, env_settings, InitSettingsSource(settings_cls, init_kwargs=data))
