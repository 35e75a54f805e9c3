"""Plain OpenAI-compatible backend: ``/chat/completions`` and ``/completions`` over httpx."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from openai.types import Completion
from openai.types.chat import ChatCompletion
from pydantic import ValidationError

from atroposlib.envs.constants import NAMESPACE_SEP, OPENAI_NAMESPACE
from atroposlib.envs.server_handling.reasoning import (
    ReasoningConfig,
    inject_reasoning,
    split_stop,
)
from atroposlib.envs.server_handling.server_baseline import (
    DEFAULT_OPENAI_URL,
    APIServer,
    APIServerConfig,
    ServerBaseline,
)
from atroposlib.errors import ConfigError, InferenceError
from atroposlib.security import is_loopback

__all__ = [
    "NAMESPACE_SEP",
    "OPENAI_KEY_VARIABLE",
    "OPENAI_NAMESPACE",
    "APIServerConfig",
    "OpenAIServer",
    "ReasoningConfig",
    "ServerBaseline",
    "missing_key_reason",
    "openai_chat_completion",
    "openai_completion",
    "request_body",
    "resolve_openai_configs",
    "with_openai_key",
]

ServerConfigs = ServerBaseline | APIServerConfig | list[APIServerConfig]
OPENAI_KEY_VARIABLE = "OPENAI_API_KEY"
"""Where a server of ``server_type openai`` without ``api_key`` finds its key, as the openai
client does."""

_LOCAL_KWARGS = ("split",)


def request_body(model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The JSON body for one request: the caller's OpenAI kwargs plus the configured model;
    token ids in ``stop`` travel as ``stop_token_ids`` (vLLM, SGLang and ours read them)."""
    body = {k: v for k, v in kwargs.items() if k not in _LOCAL_KWARGS and v is not None}
    extra_body = body.pop("extra_body", None)
    if isinstance(extra_body, dict):
        body.update(extra_body)
    body["model"] = model
    return split_stop(body)


async def openai_chat_completion(server: APIServer, kwargs: dict[str, Any]) -> ChatCompletion:
    """``POST {base_url}/chat/completions`` for ``server`` (any engine with the OpenAI API):
    the shared text path of OpenAIServer, VLLMServer and SGLangServer, which are siblings
    under APIServer as in Atropos 0.4, not subclasses of one another."""
    split = str(kwargs.get("split", "train"))
    kwargs = inject_reasoning(kwargs, server.reasoning_config, server.base_url)
    body = request_body(server.config.model_name, kwargs)
    call = _request(server, f"{server.base_url}/chat/completions", body, ChatCompletion)
    return await server.timed(split, call)


async def openai_completion(server: APIServer, kwargs: dict[str, Any]) -> Completion:
    """``POST {base_url}/completions`` for ``server``; see ``openai_chat_completion``."""
    split = str(kwargs.get("split", "train"))
    body = request_body(server.config.model_name, kwargs)
    call = _request(server, f"{server.base_url}/completions", body, Completion)
    return await server.timed(split, call)


async def _request(server: APIServer, url: str, body: dict[str, Any], model: Any) -> Any:
    data = await server.post_json(url, body)
    if not isinstance(data, dict) or not data.get("choices"):
        raise InferenceError(f"{url}: answer has no choices: {str(data)[:200]}")
    data.setdefault("object", "chat.completion" if model is ChatCompletion else "text_completion")
    data.setdefault("created", 0)
    data.setdefault("model", server.config.model_name)
    data.setdefault("id", "")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InferenceError(f"{url}: unreadable answer: {exc}") from exc


def with_openai_key(server: Mapping[str, Any], key: str | None) -> dict[str, Any]:
    """``server``'s settings with ``api_key`` set to ``key`` (``OPENAI_API_KEY``'s value)
    when it is of ``server_type openai`` (the default) and no layer gave it a key."""
    settings = dict(server)
    if key and settings.get("server_type", "openai") == "openai" and not settings.get("api_key"):
        settings["api_key"] = key
    return settings


def missing_key_reason(config: APIServerConfig) -> str | None:
    """Why ``config`` cannot work (a hosted API, https off this machine, with no key), or
    None."""
    url = config.base_url or DEFAULT_OPENAI_URL
    parts = urlsplit(url)
    if config.server_type != "openai" or config.api_key or parts.scheme != "https":
        return None
    if is_loopback(parts.hostname or ""):
        return None
    return (
        f"no API key for the server at {url}: export {OPENAI_KEY_VARIABLE}=<your key> "
        "or pass --openai.api_key"
    )


class OpenAIServer(APIServer):
    """A server that speaks only the OpenAI HTTP API (text in, text out: no token ids)."""

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        return await openai_chat_completion(self, kwargs)

    async def completion(self, **kwargs: Any) -> Completion:
        return await openai_completion(self, kwargs)


def resolve_openai_configs(
    default_server_configs: ServerConfigs | None,
    openai_config_dict: Mapping[str, Any],
    yaml_config: Mapping[str, Any],
    cli_passed_flags: Mapping[str, Any],
    logger: logging.Logger | None = None,
) -> ServerConfigs:
    """The inference servers of a run from its layered settings (Atropos 0.4's helper).

    ``openai_config_dict`` is one server's settings already merged (default < YAML < CLI);
    ``yaml_config["openai"]`` and the ``openai.<field>`` keys of ``cli_passed_flags`` are the
    raw layers. Two or more servers in YAML, or in the default list, stay a list (the CLI
    flags then apply to each); a bare ``ServerBaseline`` (servers found by SLURM or on local
    ports) stays as it is; otherwise the merged settings make the one server: an
    ``APIServerConfig`` when the default was one, else a list of it. Unusable settings:
    ConfigError naming the field.
    """
    log = logger or logging.getLogger(__name__)
    prefix = f"{OPENAI_NAMESPACE}{NAMESPACE_SEP}"
    flags = {k.removeprefix(prefix): v for k, v in cli_passed_flags.items() if k.startswith(prefix)}
    listed = yaml_config.get(OPENAI_NAMESPACE)
    if isinstance(listed, list) and len(listed) >= 2:
        log.info("inference: %d servers from the YAML key %r", len(listed), OPENAI_NAMESPACE)
        return [_server_config(server, f"{OPENAI_NAMESPACE}[{i}]", flags)
                for i, server in enumerate(listed)]  # fmt: skip
    if isinstance(default_server_configs, list) and len(default_server_configs) >= 2:
        log.info("inference: the %d default servers", len(default_server_configs))
        return [_server_config(server.model_dump(), f"{OPENAI_NAMESPACE}[{i}]", flags)
                for i, server in enumerate(default_server_configs)]  # fmt: skip
    if type(default_server_configs) is ServerBaseline:
        log.info("inference: servers discovered at run time (ServerBaseline)")
        return default_server_configs
    server = _server_config(openai_config_dict, OPENAI_NAMESPACE)
    log.info("inference: one server at %s", server.base_url or "the OpenAI API")
    return server if isinstance(default_server_configs, APIServerConfig) else [server]


def _server_config(
    values: Any, where: str, overrides: Mapping[str, Any] | None = None
) -> APIServerConfig:
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where} must be a mapping of server settings, got {values!r}")
    try:
        return APIServerConfig.model_validate({**values, **(overrides or {})})
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"])
        raise ConfigError(f"{where}.{field}: {error['msg']}") from None
