"""Atropos's import path for the proxy session client; the code lives in atroposlib.proxy.client.

Atropos 0.4 kept ``ProxyManagedServer`` and ``create_proxy_session`` here (and bound
``SequenceNode`` in this module). Our own code imports :mod:`atroposlib.proxy` instead.
"""

from atroposlib.envs.server_handling.managed import SequenceNode
from atroposlib.proxy.client import (
    ProxyError,
    ProxyManagedServer,
    ProxyRejectedError,
    create_proxy_session,
    node_trajectory,
)

__all__ = [
    "ProxyError",
    "ProxyManagedServer",
    "ProxyRejectedError",
    "SequenceNode",
    "create_proxy_session",
    "node_trajectory",
]
