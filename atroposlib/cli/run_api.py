"""``run-api``: start the broker (one process, uvicorn) from flags and ``ATROPOS_*`` variables."""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Sequence

from atroposlib.api.settings import BrokerSettings
from atroposlib.utils.cli import (
    accept_snake_case,
    exit_with_error,
    model_flags,
    parse_command_line,
)

logger = logging.getLogger("atroposlib.api")


class RunApiSettings(BrokerSettings, cli_kebab_case=True, cli_prog_name="run-api"):
    """Start the atroposlib broker: the queue between environments and the trainer."""


def parse_settings(argv: Sequence[str] | None = None) -> BrokerSettings:
    given = sys.argv[1:] if argv is None else argv
    args = accept_snake_case("run-api", given, model_flags(RunApiSettings))
    return parse_command_line(RunApiSettings, args, "run-api")


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_settings(argv)
    import uvicorn  # after parsing, so that --help and bad flags answer at once

    from atroposlib.api.app import create_app
    from atroposlib.api.store import open_store
    from atroposlib.errors import ConfigError

    try:
        open_store(settings.store).close()
    except ConfigError as err:
        exit_with_error("run-api", f"--store: {err}", status=1)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    logger.info(
        "broker listening on http://%s:%d store=%s auth=%s",
        settings.host, settings.port, settings.store,
        "bearer" if settings.api_key else "none",
    )  # fmt: skip
    app = create_app(settings)
    # Everything built so far (modules, routes, schemas) lives as long as the process: keep it
    # out of the collector's full passes, each of which otherwise stalls requests ~15 ms.
    gc.collect()
    gc.freeze()
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        log_level=settings.log_level,
        access_log=settings.log_level == "debug",
        proxy_headers=False,  # the peer is who connected, never what a header claims
    )


if __name__ == "__main__":
    main()
