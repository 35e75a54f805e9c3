"""``python -m atroposlib.proxy --config servers.json``: the proxy command (:mod:`.cli`)."""

from atroposlib.proxy.cli import main

main()
