"""The managed-server proxy: an OpenAI endpoint whose every reply is recorded token-exactly.

An agent harness that only speaks OpenAI chat (multi-turn, with tools) is pointed at a
session's endpoint, ``{proxy}/{id}/v1``; the proxy samples each reply token-in/token-out on
the inference server the session is pinned to and records the exact ids, masks and logprobs
as the session's nodes, which the environment reads to score and train on.

Who starts it:

- an environment, inside its own event loop: ``async with serve_proxy(self.server,
  self.tokenizer) as proxy`` (:mod:`.local`), then ``await proxy.open_session()`` per agent;
- a person, over servers already running: ``python -m atroposlib.proxy --config servers.json``
  (:mod:`.cli`), with sessions opened by ``create_proxy_session(url, api_key=...)``
  (:mod:`.client`).

The keys (:mod:`.access`): the proxy's key opens sessions and reads ``/v1/models`` and
``/servers``; the admin key also lists every session; each session's own token, returned once
when it is opened, is the only credential its routes take, so an agent is handed a key that
opens its session and nothing else. A proxy started by an environment always has a fresh
random key and admin key of its own; a command-line proxy takes ``ATROPOS_API_KEY`` and
``ATROPOS_ADMIN_API_KEY``; without a key it runs open, as Atropos's did, on loopback only
unless ``--insecure-no-key`` says otherwise.

Modules: :mod:`.app` (``create_app``, routes), :mod:`.protocol` (the bodies on the wire),
:mod:`.session` and :mod:`.session_table` (the recorded sessions), :mod:`.access`,
:mod:`.client`, :mod:`.local`, :mod:`.cli`. Atropos's import paths
(``atroposlib.envs.server_handling.managed_server_proxy`` and ``.proxy_client``) re-export
these names.
"""

from atroposlib.proxy.app import ProxySettings, create_app
from atroposlib.proxy.client import ProxyManagedServer, create_proxy_session, node_trajectory
from atroposlib.proxy.local import LocalProxy, serve_proxy

__all__ = [
    "LocalProxy",
    "ProxyManagedServer",
    "ProxySettings",
    "create_app",
    "create_proxy_session",
    "node_trajectory",
    "serve_proxy",
]
