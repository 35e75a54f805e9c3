"""Command-line flags generated from a settings class: one declaration, one ``--help``.

Each field (or its ``alias``) becomes ``--kebab-case`` (bool: a switch; list: repeatable;
Literal: one of its choices); fields named in ``positional`` become positional arguments. Only
the flags actually given are passed to the settings class, so its environment variables and
defaults fill the rest; values are checked by the settings class (Literal choices by argparse
too). Every error (unknown flag, bad value, broken invariant) is one line on stderr
(``atroposlib.utils.cli``'s wording) and exit status 2.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel, ValidationError

from atroposlib.utils.cli import describe_validation_error, exit_with_error

Settings = TypeVar("Settings", bound=BaseModel)


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports errors on a single line (no usage dump) and exits with 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _scalar(annotation: Any) -> tuple[Any, bool]:
    """(element type, is_list) of a field annotation; Optional is unwrapped."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return _scalar(options[0])
    if origin is list:
        return typing.get_args(annotation)[0], True
    return annotation, False


def build_parser(
    model: type[BaseModel], prog: str, description: str, positional: Sequence[str] = ()
) -> OneLineParser:
    parser = OneLineParser(prog=prog, description=description, argument_default=argparse.SUPPRESS)
    for name, info in model.model_fields.items():
        kind, is_list = _scalar(info.annotation)
        help_text = info.description or ""
        shown = not info.is_required() and info.default_factory is None and kind is not bool
        if shown and info.default not in (None, [], ()):
            help_text += f" (default: {info.default})"
        if name in positional:
            optional: dict[str, Any] = {} if info.is_required() else {"nargs": "?", "default": None}
            parser.add_argument(name, help=help_text, **optional)
            continue
        flag = "--" + (info.alias or name).replace("_", "-")
        if kind is bool:
            parser.add_argument(flag, dest=name, action="store_true", help=help_text)
        elif is_list:
            parser.add_argument(flag, dest=name, action="append", help=help_text)
        elif typing.get_origin(kind) is typing.Literal:
            choices = [str(choice) for choice in typing.get_args(kind)]
            parser.add_argument(flag, dest=name, choices=choices, help=help_text)
        else:
            metavar = "PATH" if kind is Path else name.upper()
            parser.add_argument(flag, dest=name, metavar=metavar, help=help_text)
    return parser


def parse_settings(
    model: type[Settings], parser: OneLineParser, argv: Sequence[str] | None = None
) -> Settings:
    """Parse ``argv`` into ``model``; exits with status 2 and one line on any error."""
    given = {
        key: value for key, value in vars(parser.parse_args(argv)).items() if value is not None
    }
    try:
        return model(**given)
    except ValidationError as err:
        exit_with_error(parser.prog, describe_validation_error(err))


def fail(prog: str, message: str, status: int = 1) -> NoReturn:
    """Print one line to stderr and exit."""
    exit_with_error(prog, message, status)
