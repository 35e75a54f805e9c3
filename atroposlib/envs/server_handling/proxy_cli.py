"""The servers file of ``python -m atroposlib.envs.server_handling.managed_server_proxy
--config servers.json`` (Atropos's format)::

    {"model_name": "Qwen/Qwen3-4B", "tokenizer_name": null,
     "servers": [{"base_url": "http://gpu1:9001/v1", "server_type": "embedded"}]}

Each server entry takes ``APIServerConfig``'s fields; the model name is shared.
"""

from __future__ import annotations

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
