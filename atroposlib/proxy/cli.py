"""The proxy as a command: ``python -m atroposlib.proxy --config servers.json [--port 9100]``.

The servers file is Atropos's format::

    {"model_name": "Qwen/Qwen3-4B", "tokenizer_name": null,
     "servers": [{"base_url": "http://gpu1:9001/v1", "server_type": "embedded"}]}

Each server entry takes ``APIServerConfig``'s fields; the model name is shared. The proxy's key
comes from ``ATROPOS_API_KEY`` (or ``--api-key``; the variable keeps it out of ``ps``), its admin
key (``GET /sessions`` of every client) from ``ATROPOS_ADMIN_API_KEY``; each session's routes
take the session's own token (:mod:`~atroposlib.proxy.access`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.errors import ConfigError
from atroposlib.proxy.app import ProxySettings, create_app

logger = logging.getLogger(__name__)


class ProxyServersFile(BaseModel):
    model_name: str = Field(min_length=1)
    tokenizer_name: str | None = None
    servers: list[dict[str, Any]] = Field(min_length=1)

    def server_configs(self) -> list[APIServerConfig]:
        configs = []
        for index, server in enumerate(self.servers):
            fields = {"server_type": "vllm", **server, "model_name": self.model_name}
            if self.tokenizer_name:
                fields.setdefault("tokenizer_name", self.tokenizer_name)
            try:
                configs.append(APIServerConfig.model_validate(fields))
            except ValidationError as exc:
                raise ConfigError(f"servers.{index}: {exc}") from exc
        return configs


def load_servers_file(path: Path) -> ProxyServersFile:
    try:
        return ProxyServersFile.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--config {path}: {exc}") from exc


def add_access_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the proxy's :class:`~atroposlib.security.AccessSettings` fields."""
    parser.add_argument("--host", default="127.0.0.1", help="interface (0.0.0.0 needs a key)")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("ATROPOS_API_KEY"),
        help="bearer key of every route but /health (default: ATROPOS_API_KEY)",
    )
    parser.add_argument(
        "--admin-api-key",
        default=os.environ.get("ATROPOS_ADMIN_API_KEY"),
        help="key that lists every session (default: ATROPOS_ADMIN_API_KEY)",
    )
    parser.add_argument(
        "--insecure-no-key",
        action="store_true",
        help="listen on a non-loopback --host without a key (anyone may use it)",
    )
    parser.add_argument("--allowed-hosts", nargs="*", default=[],
                        help="host names allowed besides IPs and local names")  # fmt: skip
    parser.add_argument(
        "--expose-api-docs",
        action="store_true",
        help="serve /openapi.json, /docs and /redoc (behind the key when one is set)",
    )


def access_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~atroposlib.security.AccessSettings` fields of parsed access flags."""
    return {
        "host": args.host, "api_key": args.api_key, "admin_api_key": args.admin_api_key,
        "insecure_no_key": args.insecure_no_key, "allowed_hosts": args.allowed_hosts,
        "expose_api_docs": args.expose_api_docs,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Serve the proxy over the servers of ``--config`` (its format: the module docstring)."""
    parser = argparse.ArgumentParser(description="OpenAI-compatible managed-server proxy")
    parser.add_argument(
        "--config", type=Path, required=True, help="servers file (JSON: model_name, servers)"
    )
    parser.add_argument("--port", type=int, default=9100)
    add_access_flags(parser)
    defaults = ProxySettings()
    for flag in ("max_sessions", "max_sessions_per_client", "max_session_bytes"):
        help_text = ProxySettings.model_fields[flag].description
        parser.add_argument("--" + flag.replace("_", "-"), type=int,
                            default=getattr(defaults, flag), help=help_text)  # fmt: skip
    args = parser.parse_args(argv)
    try:
        settings = ProxySettings(
            max_sessions=args.max_sessions,
            max_sessions_per_client=args.max_sessions_per_client,
            max_session_bytes=args.max_session_bytes,
            **access_fields(args),
        )
    except ValidationError as exc:
        parser.error(exc.errors()[0]["msg"].removeprefix("Value error, "))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    import uvicorn
    from transformers import AutoTokenizer

    servers = load_servers_file(args.config)
    configs = servers.server_configs()
    tokenizer = AutoTokenizer.from_pretrained(servers.tokenizer_name or servers.model_name)
    app = create_app(
        server_manager=ServerManager(configs),
        tokenizer=tokenizer,
        model_name=servers.model_name,
        settings=settings,
    )
    for config in configs:
        logger.info("backend %s (%s)", config.base_url, config.server_type)
    logger.info("proxy for %s on http://%s:%d", servers.model_name, settings.host, args.port)
    uvicorn.run(app, host=settings.host, port=args.port, log_level="info", proxy_headers=False)
