"""``python -m atroposlib.inference --model FOLDER`` (also the ``atropos-inference`` script)."""

from __future__ import annotations

import logging
import sys

import uvicorn
from pydantic import ValidationError
from pydantic_settings import CliApp

from atroposlib.inference.settings import InferenceSettings


def main(argv: list[str] | None = None) -> None:
    """Parse flags (exit 2 with a one-line reason when they are wrong) and serve."""
    try:
        settings = CliApp.run(InferenceSettings, cli_args=sys.argv[1:] if argv is None else argv)
    except ValidationError as error:
        reasons = "; ".join(
            f"--{'.'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}"
            if e["loc"]
            else e["msg"].removeprefix("Value error, ")
            for e in error.errors()
        )
        sys.stderr.write(f"atropos-inference: {reasons}\n")
        raise SystemExit(2) from None
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
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
