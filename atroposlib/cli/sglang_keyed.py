"""``python -m atroposlib.cli.sglang_keyed ARGS``: SGLang's ``launch_server`` with
``--api-key`` taken from ``ATROPOS_API_KEY``, so the key stays off every command line.

SGLang reads its key only from ``--api-key``; a key written there shows in ``ps`` (and in the
job's ``commands.tsv``) to everyone on the node. This module adds it to ``sys.argv`` inside the
process (the kernel's copy of the command line keeps the original) and runs SGLang's
``launch_server`` as ``python -m`` would. With the key, SGLang answers 401 on every route but
``/health*``, ``/metrics*`` and CORS preflights, its weight routes included. Without
``ATROPOS_API_KEY`` (or with an empty one) it stops with a message naming the fix.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Mapping, Sequence

from atroposlib.security.keys import KEY_VARIABLE, non_empty_key


def keyed_argv(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """``argv`` with ``--api-key <ATROPOS_API_KEY>``; ValueError when there is no usable key.

    >>> keyed_argv(["--port", "9000"], {"ATROPOS_API_KEY": "k"})
    ['--port', '9000', '--api-key', 'k']
    """
    if any(arg == "--api-key" or arg.startswith("--api-key=") for arg in argv):
        raise ValueError(
            "--api-key on the command line shows the key in ps; export ATROPOS_API_KEY instead"
        )
    key = non_empty_key(environ.get(KEY_VARIABLE), KEY_VARIABLE)
    if key is None:
        raise ValueError(f"{KEY_VARIABLE} is not set: export the run's key for SGLang")
    return [*argv, "--api-key", key]


def main() -> None:
    try:
        args = keyed_argv(sys.argv[1:], os.environ)
    except ValueError as error:
        sys.exit(f"sglang_keyed: error: {error}")
    sys.argv = ["sglang.launch_server", *args]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
