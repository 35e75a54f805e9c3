"""``python -m atroposlib.envs.server_handling.managed_server_proxy --config servers.json``.

``servers.json`` (Atropos's format)::

    {"model_name": "Qwen/Qwen3-4B", "tokenizer_name": null,
     "servers": [{"base_url": "http://gpu1:9001/v1", "server_type": "embedded"}]}

Each server entry takes ``APIServerConfig``'s fields; the model name is shared.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.errors import ConfigError

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


def run(argv: list[str] | None = None) -> None:
    from atroposlib.envs.server_handling.managed_server_proxy import ProxySettings, create_app

    parser = argparse.ArgumentParser(description="OpenAI-compatible managed-server proxy")
    parser.add_argument("--config", type=Path, required=True, help="servers.json (see module)")
    parser.add_argument("--host", default="127.0.0.1", help="interface (0.0.0.0: all hosts)")
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--max-sessions", type=int, default=ProxySettings().max_sessions)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    import uvicorn
    from transformers import AutoTokenizer

    from atroposlib.envs.server_handling.server_manager import ServerManager

    servers = load_servers_file(args.config)
    configs = servers.server_configs()
    tokenizer = AutoTokenizer.from_pretrained(servers.tokenizer_name or servers.model_name)
    app = create_app(
        server_manager=ServerManager(configs),
        tokenizer=tokenizer,
        model_name=servers.model_name,
        settings=ProxySettings(max_sessions=args.max_sessions),
    )
    for config in configs:
        logger.info("backend %s (%s)", config.base_url, config.server_type)
    logger.info("proxy for %s on http://%s:%d", servers.model_name, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
