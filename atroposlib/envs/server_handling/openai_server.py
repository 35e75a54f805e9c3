"""Plain OpenAI-compatible backend: ``/chat/completions`` and ``/completions`` over httpx."""

from __future__ import annotations

from typing import Any

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
    APIServer,
    APIServerConfig,
    ServerBaseline,
)
from atroposlib.errors import InferenceError

__all__ = [
    "NAMESPACE_SEP",
    "OPENAI_NAMESPACE",
    "APIServerConfig",
    "OpenAIServer",
    "ReasoningConfig",
    "ServerBaseline",
    "request_body",
]

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


class OpenAIServer(APIServer):
    """Any server that speaks the OpenAI HTTP API (OpenAI, vLLM, SGLang, our embedded server)."""

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        split = str(kwargs.get("split", "train"))
        kwargs = inject_reasoning(kwargs, self.reasoning_config, self.base_url)
        body = request_body(self.config.model_name, kwargs)
        call = self._request(f"{self.base_url}/chat/completions", body, ChatCompletion)
        return await self.timed(split, call)

    async def completion(self, **kwargs: Any) -> Completion:
        split = str(kwargs.get("split", "train"))
        body = request_body(self.config.model_name, kwargs)
        call = self._request(f"{self.base_url}/completions", body, Completion)
        return await self.timed(split, call)

    async def _request(self, url: str, body: dict[str, Any], model: Any) -> Any:
        data = await self.post_json(url, body)
        if not isinstance(data, dict) or not data.get("choices"):
            raise InferenceError(f"{url}: answer has no choices: {str(data)[:200]}")
        data.setdefault(
            "object", "chat.completion" if model is ChatCompletion else "text_completion"
        )
        data.setdefault("created", 0)
        data.setdefault("model", self.config.model_name)
        data.setdefault("id", "")
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise InferenceError(f"{url}: unreadable answer: {exc}") from exc
