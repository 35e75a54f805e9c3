"""One settings model per command, built from the env's config class.

Sources, highest first: CLI flags, environment variables (``ATROPOS_ENV__GROUP_SIZE``),
the YAML file named by ``--config``, then ``config_init()`` (plus the command's defaults).
``openai`` may be one server (flags ``--openai.<field>``) or, in YAML, a list of servers;
flags and variables for ``openai`` then apply to every server in the list.
``ATROPOS_API_KEY`` (the broker's own variable) fills ``env.rollout_server_api_key`` unless
``ATROPOS_ENV__ROLLOUT_SERVER_API_KEY`` or the flag sets it. ``OPENAI_API_KEY`` fills the
``api_key`` of a server of ``server_type openai`` that no source gave one (as the openai
client reads it).
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, create_model
from pydantic_settings import EnvSettingsSource, SettingsConfigDict
from pydantic_settings.sources import CliSuppress

from atroposlib.envs.config import BaseEnvConfig
from atroposlib.envs.server_handling.openai_server import OPENAI_KEY_VARIABLE, with_openai_key
from atroposlib.envs.server_handling.server_baseline import APIServerConfig, ServerBaseline
from atroposlib.errors import ConfigError
from atroposlib.utils.cli import settings_cli_source
from atroposlib.utils.yaml_settings import LayeredSettings, read_yaml_config

ENV_PREFIX = "ATROPOS_"
API_KEY_VARIABLE = "ATROPOS_API_KEY"  # the broker's key, shared by every process of a run
YAML_KEYS = ("env", "openai", "slurm", "testing", "teacher")


class EnvCliSettings(LayeredSettings):
    """Fields every command shares; ``env`` is replaced by the env's own config class."""

    sources_merged_by_caller: ClassVar[bool] = True  # resolve_settings merges the four sources

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", cli_implicit_flags=True
    )

    env: BaseEnvConfig = Field(default_factory=BaseEnvConfig, description="Environment settings.")
    openai: APIServerConfig | None = Field(
        default=None, description="One inference server (a list of servers: use --config YAML)."
    )
    servers: CliSuppress[list[APIServerConfig] | None] = Field(default=None, exclude=True)
    slurm: bool = Field(default=False, description="Discover inference servers from SLURM.")
    testing: bool = Field(default=False, description="Canned local answers, no inference server.")
    config: str | None = Field(default=None, description="YAML file with env: and openai: keys.")


def settings_model(
    env_config_cls: type[BaseEnvConfig],
    command: str,
    teacher: bool = False,
    description: str | None = None,
) -> type[EnvCliSettings]:
    """The command's settings; ``teacher`` adds ``--teacher.<field>`` (distillation envs),
    ``description`` opens its ``--help``."""
    fields: dict[str, Any] = {
        "env": (env_config_cls, Field(default_factory=env_config_cls, description="Env settings."))
    }
    if teacher:
        fields["teacher"] = (
            APIServerConfig | None,
            Field(default=None, description="Teacher inference server (distillation)."),
        )
    return create_model(
        f"{command.capitalize()}Settings", __base__=EnvCliSettings, __doc__=description, **fields
    )


def _dump_servers(servers: ServerBaseline | list[APIServerConfig]) -> Any:
    if isinstance(servers, list):
        dumped = [s.model_dump() for s in servers]
        return dumped[0] if len(dumped) == 1 else dumped
    if isinstance(servers, APIServerConfig):
        return servers.model_dump()
    return None


def _overlay_openai(current: Any, update: Any, baseline: ServerBaseline | None) -> Any:
    if update is None:
        return current
    if isinstance(update, list):
        return update
    if not isinstance(update, dict):
        raise ConfigError(f"openai must be a mapping or a list of mappings, got {update!r}")
    if isinstance(current, list):
        return [{**server, **update} for server in current]
    base = current if current is not None else (baseline.model_dump() if baseline else {})
    return {**base, **update}


def _with_openai_key(openai: Any, key: str | None) -> Any:
    if isinstance(openai, list):
        return [with_openai_key(s, key) if isinstance(s, Mapping) else s for s in openai]
    return with_openai_key(openai, key) if isinstance(openai, Mapping) else openai


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def bool_flags(model: type[EnvCliSettings]) -> set[str]:
    """``--env.use_wandb``, ``--slurm``...: every boolean flag of the settings model."""
    flags = {f"--{name}" for name, info in model.model_fields.items() if info.annotation is bool}
    for prefix in ("env", "openai"):
        annotation = model.model_fields[prefix].annotation
        sub_model = next(
            (
                a
                for a in getattr(annotation, "__args__", (annotation,))
                if hasattr(a, "model_fields")
            ),
            None,
        )
        if sub_model is not None:
            flags |= {
                f"--{prefix}.{name}"
                for name, info in sub_model.model_fields.items()
                if info.annotation is bool
            }
    return flags


def normalize_bool_flags(argv: list[str], flags: set[str]) -> list[str]:
    """Accept Atropos-style ``--flag False`` / ``--flag=true`` as well as ``--flag``/``--no-flag``.

    >>> flags = {"--slurm", "--testing"}
    >>> normalize_bool_flags(["--slurm", "False", "--testing=true", "--x", "1"], flags)
    ['--no-slurm', '--testing', '--x', '1']
    """
    out: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        name, sep, value = arg.partition("=")
        if name in flags:
            if not sep and index + 1 < len(argv) and argv[index + 1].lower() in _TRUE | _FALSE:
                value, sep = argv[index + 1], "="
                index += 1
            if sep and value.lower() in _FALSE:
                arg = "--no-" + name[2:]
            elif sep and value.lower() in _TRUE:
                arg = name
        out.append(arg)
        index += 1
    return out


def command_env_values(
    env_config: BaseEnvConfig, command_defaults: dict[str, Any], replaces: Collection[str] = ()
) -> tuple[dict[str, Any], set[str]]:
    """``config_init()``'s env values under the command's defaults, and the keys those set: a
    command default replaces a value ``config_init()`` left at its field default, or any value
    when its key is in ``replaces``."""
    values: dict[str, Any] = env_config.model_dump()
    taken = {
        key for key in command_defaults if key not in env_config.model_fields_set or key in replaces
    }
    values.update({key: command_defaults[key] for key in taken})
    return values, taken


def resolve_settings(
    model: type[EnvCliSettings],
    argv: list[str],
    defaults: tuple[BaseEnvConfig, ServerBaseline | list[APIServerConfig]],
    command_defaults: dict[str, Any],
    environ: dict[str, str] | None = None,
    replaces: Collection[str] = (),
    cli_options: dict[str, Any] | None = None,
) -> EnvCliSettings:
    """Merge the four sources and validate once (pydantic raises on any bad value).
    ``cli_options`` go to the command-line source (``--help``'s rendering)."""
    cli = settings_cli_source(
        model,
        normalize_bool_flags(argv, bool_flags(model)),
        f"{Path(sys.argv[0]).name} {model.__name__[:-8].lower()}",
        **{"cli_implicit_flags": True, "cli_hide_none_type": False, **(cli_options or {})},
    )()
    env_source = EnvSettingsSource(
        model, env_prefix=ENV_PREFIX, env_nested_delimiter="__", case_sensitive=False
    )
    if environ is not None:
        env_source.env_vars = {k.lower(): v for k, v in environ.items()}
    from_env = env_source()
    shared_key = env_source.env_vars.get(API_KEY_VARIABLE.lower())
    if shared_key and "rollout_server_api_key" not in (from_env.get("env") or {}):
        from_env["env"] = {**(from_env.get("env") or {}), "rollout_server_api_key": shared_key}
    config_path = cli.get("config") or from_env.get("config")
    from_yaml = read_yaml_config(config_path, keys=YAML_KEYS) if config_path else {}

    env_config, servers = defaults
    baseline = servers if isinstance(servers, ServerBaseline) else None
    merged_env, _ = command_env_values(env_config, command_defaults, replaces)
    openai: Any = _dump_servers(servers)
    flags: dict[str, Any] = {}
    known = set(type(env_config).model_fields)
    for source, layer in (("--config", from_yaml), ("environment", from_env), ("CLI", cli)):
        unknown = set(layer.get("env") or {}) - known
        if unknown:
            raise ConfigError(f"{source}: unknown env setting(s) {sorted(unknown)}")
        merged_env.update(layer.get("env") or {})
        openai = _overlay_openai(openai, layer.get("openai"), baseline)
        flags.update({k: layer[k] for k in ("slurm", "testing") if k in layer})
        if "teacher" in model.model_fields and layer.get("teacher") is not None:
            flags["teacher"] = {**(flags.get("teacher") or {}), **layer["teacher"]}
    openai = _with_openai_key(openai, env_source.env_vars.get(OPENAI_KEY_VARIABLE.lower()))
    values: dict[str, Any] = {"env": merged_env, "config": config_path, **flags}
    if isinstance(openai, list):
        values["servers"] = openai
    elif openai is not None:
        values["openai"] = openai
    return model(**values)
