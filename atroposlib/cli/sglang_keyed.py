"""``python -m atroposlib.cli.sglang_keyed ARGS``: SGLang's ``launch_server`` behind our guard,
with no key in SGLang's own arguments.

SGLang logs its arguments when its engine starts (``server_args=ServerArgs(..., api_key=...)``)
and answers ``GET /get_server_info`` with all of them, so a key handed to SGLang (``--api-key``)
would land in the job's log folder and in every answer of that route. Here SGLang gets no key:
the guard our vLLM servers mount (:mod:`atroposlib.vllm_plugin.guard`) is added to SGLang's
FastAPI app before it starts and checks the keys it reads from the environment:
``ATROPOS_API_KEY`` opens sampling (``/generate``, ``/v1/...``), ``ATROPOS_ADMIN_API_KEY`` every
route (weights, pause, LoRA, ``/get_server_info``). SGLang's own warm-up request would carry no
key, so it is skipped (``--skip-server-warmup``); the launcher's first ``/health`` (a one-token
generation) warms the server instead. Its multi-tokenizer mode serves from workers that import
the app afresh, without the guard, so ``--tokenizer-worker-num`` above 1 is refused.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
from collections.abc import Mapping, Sequence

from pydantic import ValidationError

from atroposlib.security.keys import ADMIN_KEY_VARIABLE, KEY_VARIABLE
from atroposlib.vllm_plugin.guard import VllmGuard, settings_from

APP_MODULE = "sglang.srt.entrypoints.http_server"
"""Where SGLang's FastAPI ``app`` lives; its ``launch_server`` serves that very object."""
SKIP_WARMUP = "--skip-server-warmup"


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
    return None


def server_argv(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """SGLang's arguments: ``argv`` with ``--skip-server-warmup``; ValueError naming the fix.

    >>> server_argv(["--port", "9000"], {"ATROPOS_API_KEY": "k"})
    ['--port', '9000', '--skip-server-warmup']
    """
    if any(arg.startswith(("--api-key", "--admin-api-key")) for arg in argv):
        raise ValueError(
            "a key on SGLang's command line shows in ps and in SGLang's logs; export "
            f"{KEY_VARIABLE} (and {ADMIN_KEY_VARIABLE}) instead"
        )
    workers = _flag_value(argv, "--tokenizer-worker-num")
    if workers is not None and workers != "1":
        raise ValueError(
            f"--tokenizer-worker-num {workers}: SGLang's tokenizer workers serve without the "
            "guard; leave it at 1"
        )
    try:
        keys = settings_from(environ)
    except ValidationError as exc:
        raise ValueError("; ".join(str(e["msg"]).removeprefix("Value error, ")
                                   for e in exc.errors())) from None  # fmt: skip
    if not keys.run_keys:
        raise ValueError(f"{KEY_VARIABLE} is not set: export the run's key for SGLang")
    return [*argv] if SKIP_WARMUP in argv else [*argv, SKIP_WARMUP]


def guard_sglang_app(environ: Mapping[str, str]) -> None:
    """Put the guard around SGLang's app (before ``launch_server`` serves it)."""
    app = getattr(importlib.import_module(APP_MODULE), "app", None)
    if app is None or not hasattr(app, "add_middleware"):
        raise ValueError(f"this SGLang has no FastAPI app in {APP_MODULE}; pin a release that has")
    app.add_middleware(VllmGuard, environ=dict(environ))


def main() -> None:
    try:
        args = server_argv(sys.argv[1:], os.environ)
        guard_sglang_app(os.environ)
    except (ValueError, ImportError) as error:
        sys.exit(f"sglang_keyed: error: {error}")
    sys.argv = ["sglang.launch_server", *args]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
