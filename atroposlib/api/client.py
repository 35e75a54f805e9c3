"""Deprecated location of the broker clients: import them from :mod:`atroposlib.client`.

The clients live beside the protocol, not in the broker's package, so environments, the
trainer and the tools no longer import the server to talk to it. This module re-exports
them for code written against the old path and will be removed in a later release.
"""

from atroposlib.client import Batch, EnvClient, TrainerClient, backoff_delays

__all__ = ["Batch", "EnvClient", "TrainerClient", "backoff_delays"]
