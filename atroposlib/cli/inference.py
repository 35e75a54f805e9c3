"""``atropos-inference`` (also ``python -m atroposlib.inference``): the embedded inference server.

A bad value exits 2 with ``atropos-inference: error: --port: ...`` and ``--help`` shows one
default per option.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pydantic import ValidationError
from pydantic_settings import CliApp, SettingsError

from atroposlib.inference.settings import InferenceSettings
from atroposlib.utils.cli import configure_logging, describe, exit_with_error, settings_cli_source

PROG = "atropos-inference"


def parse_settings(argv: Sequence[str] | None = None) -> InferenceSettings:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        source = settings_cli_source(
            InferenceSettings, args, PROG, cli_kebab_case=True, cli_implicit_flags=True
        )
        return CliApp.run(InferenceSettings, cli_args=args, cli_settings_source=source)
    except (SettingsError, ValidationError) as err:
        exit_with_error(PROG, describe(err))


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_settings(argv)
    configure_logging(settings.log_level.upper())
    import uvicorn  # after parsing, so that --help and bad flags answer at once

    from atroposlib.inference.app import create_app

    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.log_level == "debug",
        timeout_graceful_shutdown=10,
    )


if __name__ == "__main__":
    main()
