"""``python my_env.py serve|process|evaluate``: parse settings, build the env, run the mode."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from pydantic import ValidationError
from pydantic_settings import SettingsError

from atroposlib.envs.atropos_output import write_evaluate_config
from atroposlib.envs.cli_help import EnvHelp, command_description
from atroposlib.envs.modes import MODES
from atroposlib.envs.server_handling.openai_server import missing_key_reason
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.settings import EnvCliSettings, resolve_settings, settings_model
from atroposlib.envs.tokenizer_check import SWITCH_OFF, check_tokenizer
from atroposlib.errors import ConfigError, InferenceEngineDeadError
from atroposlib.utils.cli import configure_logging, describe, snake_flag

if TYPE_CHECKING:
    from atroposlib.envs.served import ServedEnv

logger = logging.getLogger(__name__)


def _usage(env_cls: type[ServedEnv]) -> str:
    lines = [f"usage: {sys.argv[0]} {{serve,process,evaluate}} [--help] [options]", ""]
    lines.append(f"CLI for {env_cls.__name__}. Commands:")
    lines.extend(f"  {name:<9} {mode.summary}" for name, mode in MODES.items())
    return "\n".join(lines)


def _fail(message: str) -> NoReturn:
    sys.stderr.write(f"error: {message}\n")
    raise SystemExit(2)


def _env_flag(loc: Sequence[str]) -> str:
    """``("servers", "timeout")`` -> ``--openai.timeout`` (a server list comes from --openai)."""
    return snake_flag(["openai" if part == "servers" else part for part in loc])


def describe_validation_error(exc: ValidationError) -> str:
    """The first error as one line: the flag it came from and what it accepts."""
    return describe(exc, _env_flag)


def parse_settings(
    env_cls: type[ServedEnv], command: str, argv: list[str], environ: dict[str, str] | None = None
) -> EnvCliSettings:
    defaults = env_cls.config_init()
    wants_help = "-h" in argv or "--help" in argv
    model = settings_model(
        type(defaults[0]),
        command,
        teacher=_has_teacher(env_cls),
        description=command_description(env_cls, command) if wants_help else None,
    )
    mode = MODES[command]
    cli_options = EnvHelp.for_command(env_cls, command).cli_options() if wants_help else None
    try:
        return resolve_settings(
            model, argv, defaults, mode.defaults(env_cls), environ,
            replaces=mode.replaces_config_init, cli_options=cli_options,
        )  # fmt: skip
    except SettingsError as exc:
        _fail(describe(exc, _env_flag))
    except ValidationError as exc:
        _fail(describe_validation_error(exc))
    except ConfigError as exc:
        _fail(str(exc))


def _has_teacher(env_cls: type[ServedEnv]) -> bool:
    return hasattr(env_cls, "teacher_config_init")


def _teacher_configs(env_cls: type[ServedEnv], settings: EnvCliSettings) -> Any:
    """``--teacher.*`` / YAML ``teacher:`` over ``teacher_config_init()``."""
    given = getattr(settings, "teacher", None)
    default = env_cls.teacher_config_init()  # type: ignore[attr-defined]
    if given is None:
        return default
    base = default[0] if isinstance(default, list) and default else default
    base_values = base.model_dump() if base is not None else {}
    return [APIServerConfig(**{**base_values, **given.model_dump(exclude_unset=True)})]


def run_servers(env_cls: type[ServedEnv], settings: EnvCliSettings) -> Any:
    """The inference servers of the run: the CLI's / YAML's, else ``config_init()``'s."""
    servers: Any = settings.servers or ([settings.openai] if settings.openai else None)
    return env_cls.config_init()[1] if servers is None else servers


def build_env(env_cls: type[ServedEnv], settings: EnvCliSettings) -> ServedEnv:
    env_config = settings.env
    if env_config.wandb_name is None and env_cls.name:
        env_config.wandb_name = env_cls.name
    servers = run_servers(env_cls, settings)
    if _has_teacher(env_cls):
        return env_cls(  # type: ignore[call-arg]
            env_config,
            servers,
            teacher_server_configs=_teacher_configs(env_cls, settings),
            slurm=settings.slurm,
            testing=settings.testing,
        )
    return env_cls(env_config, servers, slurm=settings.slurm, testing=settings.testing)


def check_server_keys(settings: EnvCliSettings, servers: Any) -> None:
    """ConfigError when a hosted server (https, off this machine) would be asked with no key."""
    if settings.testing or not isinstance(servers, list):
        return
    for server in servers:
        reason = missing_key_reason(server) if isinstance(server, APIServerConfig) else None
        if reason is not None:
            raise ConfigError(reason)


async def run_mode(env: ServedEnv, command: str) -> Any:
    """Check the env's tokenizer against its servers, then run the command."""
    if env.config.check_tokenizer:
        try:
            await check_tokenizer(
                env.server.servers, lambda: env.tokenizer, env.config.tokenizer_name
            )
        except ConfigError:
            await env.server.close()
            raise
    else:
        logger.info("tokenizer not checked against the servers (%s)", SWITCH_OFF)
    return await MODES[command].run(env)


def run_cli(env_cls: type[ServedEnv], argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(_usage(env_cls) + "\n")
        raise SystemExit(0 if args else 2)
    command, rest = args[0], args[1:]
    if command not in MODES:
        _fail(f"unknown command {command!r}; use one of: {', '.join(MODES)}")
    settings = parse_settings(env_cls, command, rest)
    configure_logging(logging.INFO)
    if command == "evaluate" and settings.env.data_dir_to_save_evals is not None:
        write_evaluate_config(settings.env.data_dir_to_save_evals, settings.env,
                              run_servers(env_cls, settings), slurm=settings.slurm,
                              testing=settings.testing)  # fmt: skip
    try:
        check_server_keys(settings, run_servers(env_cls, settings))
        env = build_env(env_cls, settings)
    except ConfigError as exc:
        _fail(str(exc))
    try:
        asyncio.run(run_mode(env, command))
    except (ConfigError, InferenceEngineDeadError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
