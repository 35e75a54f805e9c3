"""``python -m atroposlib.api``: the same as ``run-api``."""

from atroposlib.cli.run_api import main

main()
