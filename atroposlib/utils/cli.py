"""The shared shell of every command line: one parser, one-line errors, one default per option.

Every CLI (``atropos-local``, ``run-api``, ``atropos-grpo``, ``atropos-inference``, the env
``serve/process/evaluate`` commands, the export and viewer tools) parses its flags with
pydantic-settings from its settings class, reports a bad value the same way, on one line, and
exits with status 2::

    atropos-local: error: --steps: input should be a valid integer, got 'abc'

A command calls ``parse_command_line``; the layered trainer and env settings (YAML below the
flags) build the same source with ``settings_cli_source``. Errors are raised (not printed with a
usage dump) and ``--help`` shows one default per option.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable, Collection, Sequence
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings, CliApp, CliSettingsSource, SettingsError

FlagName = Callable[[Sequence[str]], str]
Settings = TypeVar("Settings", bound=BaseSettings)

# pydantic's own wording ends some messages with a detail the value already shows
_PARSING_DETAIL = re.compile(r", unable to (?:parse|interpret) .*$")
_AUTO_DEFAULT = re.compile(r"\s*\(default(?: factory)?: [^()]*(?:\([^()]*\)[^()]*)*\)\s*$")


def kebab_flag(loc: Sequence[str]) -> str:
    """``("max_token_len",)`` -> ``--max-token-len``."""
    return "--" + ".".join(part.replace("_", "-") for part in loc)


def snake_flag(loc: Sequence[str]) -> str:
    """``("env", "group_size")`` -> ``--env.group_size``."""
    return "--" + ".".join(loc)


def model_flags(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every ``--kebab-case`` flag of ``model`` (nested models dotted, ``--no-`` for switches).

    >>> from pydantic import BaseModel
    >>> class Run(BaseModel):
    ...     dry_run: bool = False
    ...     max_steps: int = 1
    >>> sorted(model_flags(Run))
    ['--dry-run', '--max-steps', '--no-dry-run']
    """
    flags: set[str] = set()
    for name, info in model.model_fields.items():
        kebab = prefix + name.replace("_", "-")
        flags.add(f"--{kebab}")
        if info.annotation is bool:
            flags.add(f"--no-{kebab}")
        nested = info.annotation
        if isinstance(nested, type) and issubclass(nested, BaseModel):
            flags |= model_flags(nested, f"{kebab}.")
    return flags


def accept_snake_case(prog: str, argv: Sequence[str], known: Collection[str]) -> list[str]:
    """``argv`` with old ``--snake_case`` spellings of ``known`` flags spelled ``--kebab-case``,
    one deprecation line on stderr for each (the hidden aliases of a command that moved to
    kebab case). Anything else is left as typed, for the parser to refuse by that name.

    >>> known = {"--max-queued-groups", "--port"}
    >>> accept_snake_case("run-api", ["--max-queued-groups=1", "--bogus_flag", "--port"], known)
    ['--max-queued-groups=1', '--bogus_flag', '--port']
    """
    out = []
    for arg in argv:
        name, sep, value = arg.partition("=")
        kebab = name.replace("_", "-")
        if arg.startswith("--") and kebab != name and kebab in known:
            sys.stderr.write(
                f"{prog}: warning: {name} is deprecated, use {kebab} "
                "(the old spelling goes in a later release)\n"
            )
            arg = kebab + sep + value
        out.append(arg)
    return out


def describe_validation_error(err: ValidationError, flag: FlagName = kebab_flag) -> str:
    """The first error as ``--field: reason, got 'value'`` (``(+N more)`` when there are more).

    >>> from pydantic import BaseModel, Field
    >>> class Run(BaseModel):
    ...     steps: int = Field(gt=0)
    >>> try:
    ...     Run(steps="abc")
    ... except ValidationError as err:
    ...     print(describe_validation_error(err))
    --steps: input should be a valid integer, got 'abc'
    >>> try:
    ...     Run(steps="-5")
    ... except ValidationError as err:
    ...     print(describe_validation_error(err))
    --steps: input should be greater than 0, got '-5'
    >>> from typing import Literal
    >>> class Sync(BaseModel):
    ...     mode: Literal["disk", "http"] = "disk"
    >>> try:
    ...     Sync(mode="nccl")
    ... except ValidationError as err:
    ...     print(describe_validation_error(err))
    --mode: invalid choice 'nccl' (choose from 'disk' or 'http')

    An unknown key can only come from YAML or a variable (argparse refuses unknown flags), so
    it is named as written there, not as a flag.
    """
    errors = err.errors()
    given = [e for e in errors if e["type"] != "missing"]
    first = (given or errors)[0]  # a bad value given beats a flag left out
    loc = [str(part) for part in first["loc"] if not isinstance(part, int)]
    custom = first["type"] in ("value_error", "assertion_error")
    message = str(first["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if first["type"] == "literal_error":
        message = f"invalid choice {first['input']!r} (choose from {first['ctx']['expected']})"
    elif not custom:
        message = _PARSING_DETAIL.sub("", message)
        message = message[:1].lower() + message[1:]
        value = first.get("input")
        if first["type"] != "missing" and loc and not isinstance(value, dict | list):
            message += f", got {value!r}"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    label = ".".join(loc) if first["type"] == "extra_forbidden" else flag(loc)
    return f"{label}: {message}{more}" if loc else f"{message}{more}"


def describe_settings_error(err: SettingsError) -> str:
    """pydantic-settings' parse errors (unknown flag, bad JSON) as one line."""
    text = " ".join(str(err).removeprefix("error parsing CLI: ").split())
    return f"{text} (see --help)"


def describe(err: ValidationError | SettingsError, flag: FlagName = kebab_flag) -> str:
    if isinstance(err, ValidationError):
        return describe_validation_error(err, flag)
    cause = err.__cause__ or err.__context__
    if isinstance(cause, ValidationError):
        return describe_validation_error(cause, flag)
    return describe_settings_error(err)


def configure_logging(level: int | str = logging.INFO) -> None:
    """Log lines with time, level and logger; HTTP clients' per-request lines only as DEBUG."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    verbose = logging.getLogger().getEffectiveLevel() <= logging.DEBUG
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.WARNING)


def exit_with_error(prog: str, message: str, status: int = 2) -> NoReturn:
    """``prog: error: message`` on stderr, then exit (2: a bad command line)."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    raise SystemExit(status)


def one_default(help_text: str) -> str:
    """Drop the default pydantic-settings appends when the description already states one.

    >>> one_default("Run folder (default: runs/<date>). (default: null)")
    'Run folder (default: runs/<date>).'
    >>> one_default("Trainer optimizer steps. (default: 40)")
    'Trainer optimizer steps. (default: 40)'
    """
    described = _AUTO_DEFAULT.sub("", help_text)
    if described != help_text and "default" in described.lower():
        return described
    return help_text


def without_default(help_text: str) -> str:
    """``help_text`` without the default pydantic-settings appended.

    >>> without_default("Responses per group. (default: 4)")
    'Responses per group.'
    """
    return _AUTO_DEFAULT.sub("", help_text)


def add_argument_one_default(parser: Any, *names: str, **kwargs: Any) -> Any:
    """``parser.add_argument`` with ``one_default`` applied to the help text; a switch
    (``--quiet``) shows no default (it is off unless given), a positional argument is shown by
    its field name (``filepath``)."""
    help_text = kwargs.get("help")
    if isinstance(help_text, str):
        help_text = help_text.replace("(default factory: <lambda>)", "(default: computed)")
        switch = kwargs.get("action") in ("store_true", "store_false")
        kwargs["help"] = _AUTO_DEFAULT.sub("", help_text) if switch else one_default(help_text)
    if names and not names[0].startswith("-"):
        kwargs.pop("metavar", None)
    return parser.add_argument(*names, **kwargs)


def settings_cli_source(
    settings_cls: type[BaseSettings], argv: Sequence[str] | None, prog: str, **options: Any
) -> CliSettingsSource[Any]:
    """The command-line source of ``settings_cls`` (``argv`` parsed now unless None): raises
    ``SettingsError`` instead of printing usage, one default per option in ``--help``."""
    return CliSettingsSource(
        settings_cls,
        cli_parse_args=None if argv is None else list(argv),
        cli_prog_name=prog,
        cli_exit_on_error=False,
        **{"cli_hide_none_type": True, "add_argument_method": add_argument_one_default, **options},
    )


def parse_command_line(
    settings_cls: type[Settings],
    argv: Sequence[str] | None,
    prog: str,
    *,
    description: str | None = None,
    epilog: str | None = None,
    **source_options: Any,
) -> Settings:
    """``settings_cls`` from ``argv`` (default ``sys.argv[1:]``), then its environment variables
    and defaults. Flags are ``--kebab-case`` (pydantic-settings' ``cli_*`` settings of the class,
    or ``source_options``, shape them); any error is one line ``prog: error: ...`` on stderr and
    exit status 2. ``description`` (default: the class docstring) and ``epilog`` frame ``--help``,
    reflowed to the terminal's width.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        options = {"cli_kebab_case": True, "formatter_class": argparse.HelpFormatter}
        source = settings_cli_source(settings_cls, None, prog, **{**options, **source_options})
        if description is not None:
            source.root_parser.description = description
        source.root_parser.epilog = epilog
        return CliApp.run(settings_cls, cli_args=args, cli_settings_source=source)
    except (SettingsError, ValidationError) as err:
        exit_with_error(prog, describe(err))
