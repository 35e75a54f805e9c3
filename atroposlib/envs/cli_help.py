"""What ``python my_env.py <command> --help`` shows: for each option, the value this env uses
when the option is not given, and where that value comes from.

A default is the env config class's own field default, or ``<Env>.config_init()``'s value where
it differs (for ``--openai.*``: its inference servers'), or the command's (``process`` writes 2
groups to ``data/<name>.jsonl``). A flag's type reads as the value it takes (a secret is
``str``), and the ``openai`` group is not called undefined when ``config_init()`` fills it.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, SecretStr

from atroposlib.envs.config import BaseEnvConfig
from atroposlib.envs.modes import MODES
from atroposlib.envs.server_handling.server_baseline import APIServerConfig, ServerBaseline
from atroposlib.envs.settings import command_env_values
from atroposlib.utils.cli import add_argument_one_default, without_default

if TYPE_CHECKING:
    from atroposlib.envs.served import ServedEnv

_UNDEFINED_GROUP = "default: null (undefined)"  # pydantic-settings' header of an optional group
_MISSING = object()
_WIDTH = 78


@dataclass(frozen=True)
class Default:
    """The value an option takes when it is not given; ``source`` None: the field's default."""

    value: str
    source: str | None = None

    def help_suffix(self) -> str:
        source = f", {self.source}" if self.source else ""
        return f"(default: {self.value}{source})".replace("%", "%%")


def _fill(text: str) -> str:
    return textwrap.fill(text, _WIDTH, break_on_hyphens=False)


def render_value(value: Any) -> str:
    """A default as one would type it; a secret is never shown.

    >>> [render_value(v) for v in (None, 8, "x", "", SecretStr("k"), [1, 2], True)]
    ['null', '8', 'x', '""', 'set (hidden)', '[1, 2]', 'True']
    """
    if value is None:
        return "null"
    if value == "":
        return '""'
    if isinstance(value, SecretStr):
        return "set (hidden)"
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, BaseModel):
        return json.dumps(value.model_dump(mode="json"))
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, default=str)
    return str(value)


def _leaves(model: BaseModel, default: Any, prefix: str) -> Iterator[tuple[str, Any, bool]]:
    """``(flag, value, differs from the class default)`` per field, nested models dotted."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        base = getattr(default, name, _MISSING)
        flag = f"{prefix}.{name}"
        if isinstance(value, BaseModel) and isinstance(base, BaseModel):
            yield from _leaves(value, base, flag)
        else:
            if name.endswith("api_key") and value:
                value = SecretStr(str(value))  # a key given in config_init is never printed
            yield flag, value, base is _MISSING or value != base


def env_defaults(
    env_cls: type[ServedEnv], env_config: BaseEnvConfig, command: str
) -> dict[str, Default]:
    """``--env.<field>`` -> the value ``command`` runs with when the flag is not given
    (``env_config``: ``config_init()``'s)."""
    mode = MODES[command]
    command_values = mode.defaults(env_cls)
    _, from_command = command_env_values(env_config, command_values, mode.replaces_config_init)
    origin = f"from {env_cls.__name__}.config_init"
    defaults: dict[str, Default] = {}
    for flag, value, differs in _leaves(env_config, type(env_config).model_construct(), "--env"):
        defaults[flag] = Default(render_value(value), origin if differs else None)
    for key in from_command:
        defaults[f"--env.{key}"] = Default(render_value(command_values[key]), f"from {command}")
    return defaults


def _server_list(servers: Any) -> list[BaseModel]:
    if isinstance(servers, APIServerConfig | ServerBaseline):
        return [servers]
    return [s for s in servers or [] if isinstance(s, BaseModel)]


def openai_defaults(env_cls: type[ServedEnv], configured: Any) -> dict[str, Default]:
    """``--openai.<field>`` -> the value of ``config_init()``'s servers (``configured``; one per
    server when they differ)."""
    servers = _server_list(configured)
    origin = f"from {env_cls.__name__}.config_init"
    values: dict[str, list[str]] = {}
    changed: set[str] = set()
    for server in servers:
        for flag, value, differs in _leaves(server, APIServerConfig.model_construct(), "--openai"):
            values.setdefault(flag, []).append(render_value(value))
            if differs:
                changed.add(flag)
    defaults: dict[str, Default] = {}
    for flag, rendered in values.items():
        text = rendered[0] if len(set(rendered)) == 1 else f"{', '.join(rendered)} (per server)"
        defaults[flag] = Default(text, origin if flag in changed else None)
    return defaults


def servers_note(env_cls: type[ServedEnv], servers: Any) -> str:
    """The ``openai`` group's line on what runs when no ``--openai.*`` flag is given
    (``servers``: ``config_init()``'s)."""
    origin = f"{env_cls.__name__}.config_init"
    if isinstance(servers, ServerBaseline):
        return f"Unless given: servers found by --slurm, with the settings of {origin}."
    count = len(_server_list(servers))
    which = "the server" if count == 1 else f"the {count} servers"
    return f"Unless given: {which} of {origin} (defaults below)."


class EnvHelp:
    """The parser hooks that write an env command's ``--help`` (``cli_options()``)."""

    def __init__(self, defaults: dict[str, Default], group_notes: dict[str, str]) -> None:
        self.defaults = defaults
        self.group_notes = group_notes

    @classmethod
    def for_command(cls, env_cls: type[ServedEnv], command: str) -> EnvHelp:
        env_config, servers = env_cls.config_init()
        defaults = {
            **env_defaults(env_cls, env_config, command),
            **openai_defaults(env_cls, servers),
        }
        return cls(defaults, {"openai options": servers_note(env_cls, servers)})

    def cli_options(self) -> dict[str, Any]:
        return {"add_argument_method": self.add_argument, "add_argument_group_method": self.group}

    def add_argument(self, parser: Any, *names: str, **kwargs: Any) -> Any:
        metavar = kwargs.get("metavar")
        if isinstance(metavar, str):
            kwargs["metavar"] = metavar.replace("SecretStr", "str")
        default = self.defaults.get(names[0]) if names else None
        help_text = kwargs.get("help")
        if default is None or not isinstance(help_text, str) or help_text == argparse.SUPPRESS:
            return add_argument_one_default(parser, *names, **kwargs)
        described = without_default(help_text)
        if default.source is not None or "default" not in described.lower():
            described = f"{described} {default.help_suffix()}".strip()
        kwargs["help"] = described
        return parser.add_argument(*names, **kwargs)

    def group(self, parser: Any, **kwargs: Any) -> Any:
        description = kwargs.get("description")
        if description != argparse.SUPPRESS:
            lines = [line for line in (description or "").splitlines() if line != _UNDEFINED_GROUP]
            note = self.group_notes.get(kwargs.get("title", ""))
            text = " ".join([*lines, *([note] if note else [])])
            kwargs["description"] = _fill(text) if text else None
        return parser.add_argument_group(**kwargs)


def command_description(env_cls: type[ServedEnv], command: str) -> str:
    """The first lines of ``--help``: what the command does and the order of the sources."""
    sources = f"'from {env_cls.__name__}.config_init'"
    if MODES[command].defaults(env_cls):
        sources += f" / 'from {command}'"
    paragraphs = (
        f"{env_cls.__name__} {command}: {MODES[command].summary}.",
        "Each option's default is the value used when it is not given: the field's own, or "
        f"{sources} where those set it. "
        "Given values win in this order: flags, ATROPOS_ENV__<FIELD> and "
        "ATROPOS_OPENAI__<FIELD> variables, the --config YAML.",
    )
    return "\n".join(_fill(paragraph) for paragraph in paragraphs)
