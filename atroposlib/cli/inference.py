"""``atropos-inference`` (also ``python -m atroposlib.inference``): the embedded inference server.

A bad value exits 2 with ``atropos-inference: error: --port: ...`` and ``--help`` shows one
default per option.
"""

from __future__ import annotations

from collections.abc import Sequence

from atroposlib.inference.settings import InferenceSettings
from atroposlib.utils.cli import configure_logging, parse_command_line

PROG = "atropos-inference"


def parse_settings(argv: Sequence[str] | None = None) -> InferenceSettings:
    return parse_command_line(InferenceSettings, argv, PROG)


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
        proxy_headers=False,  # the peer is who connected, never what a header claims
    )


if __name__ == "__main__":
    main()
