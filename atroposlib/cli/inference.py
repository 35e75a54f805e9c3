"""``atropos-inference``: the embedded inference server, its flags checked the shared way.

A bad value exits 2 with ``atropos-inference: error: --port: ...`` and ``--help`` shows one
default per option; valid flags go on unchanged to ``python -m atroposlib.inference``'s main.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pydantic import ValidationError
from pydantic_settings import CliApp, SettingsError

from atroposlib.inference.settings import InferenceSettings
from atroposlib.utils.cli import describe, exit_with_error, settings_cli_source

PROG = "atropos-inference"


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        source = settings_cli_source(
            InferenceSettings, args, PROG, cli_kebab_case=True, cli_implicit_flags=True
        )
        CliApp.run(InferenceSettings, cli_args=args, cli_settings_source=source)
    except (SettingsError, ValidationError) as err:
        exit_with_error(PROG, describe(err))
    from atroposlib.inference.__main__ import main as serve

    serve(args)


if __name__ == "__main__":
    main()
