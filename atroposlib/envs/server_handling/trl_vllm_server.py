"""TRL backend (``server_type: trl``): the HTTP server of ``trl vllm-serve`` before TRL 1.0.

That server answers ``POST /generate/`` with ``{"prompts": [text, ...], "n", "temperature",
"top_p", "top_k", "min_p", "repetition_penalty", "max_tokens"}`` by
``{"completion_ids": [[token id, ...], ...]}`` (``n`` per prompt; later versions add
``prompt_ids`` and ``logprobs``) and ``GET /health/``. Chats are rendered with the model's
chat template here and replies decoded here, so this backend gives text, not token ids
(``managed_server()`` needs ``vllm``, ``sglang`` or ``embedded``). From TRL 1.0 on,
``trl vllm-serve`` runs vLLM's own server: use ``server_type: vllm`` for it.

Needs ``transformers`` and ``aiohttp`` (``pip install "atroposlib[atropos-compat]"``).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any, TypeGuard

import aiohttp
from openai.types import Completion
from openai.types.chat import ChatCompletion
from transformers import AutoTokenizer

from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    ReasoningConfig,
    tokenizer_name_of,
)
from atroposlib.errors import InferenceError, InferenceRejectedError

__all__ = ["APIServer", "APIServerConfig", "ReasoningConfig", "TrlVllmServer"]

logger = logging.getLogger(__name__)

SAMPLING_FIELDS = ("n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty")
DEFAULT_MAX_TOKENS = 1024
"""Sent when the caller gives no ``max_tokens`` (TRL's server would stop at 16)."""
_HANDLED = {*SAMPLING_FIELDS, "max_tokens", "max_completion_tokens", "stop", "model",
            "messages", "prompt", "split"}  # fmt: skip


class TrlVllmServer(APIServer):
    """Chat and text completions from a ``trl vllm-serve`` server at ``base_url``."""

    def __init__(
        self, config: APIServerConfig, reasoning_config: ReasoningConfig | None = None
    ) -> None:
        super().__init__(config, reasoning_config=reasoning_config)
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_name_of(config))
        self._session: aiohttp.ClientSession | None = None
        self._ignored: set[str] = set()

    async def _chat_completion_wrapper(self, **kwargs: Any) -> ChatCompletion:
        prompt = self.tokenizer.apply_chat_template(
            kwargs.get("messages", []), tokenize=False, add_generation_prompt=True
        )
        replies = await self._generate(str(prompt), kwargs)
        choices = [
            {"index": i, "finish_reason": reason,
             "message": {"role": "assistant", "content": text}}
            for i, (text, reason) in enumerate(replies)
        ]  # fmt: skip
        return ChatCompletion.model_validate(self._envelope("chat.completion", choices))

    async def _completion_wrapper(self, **kwargs: Any) -> Completion:
        replies = await self._generate(str(kwargs.get("prompt", "")), kwargs)
        choices = [
            {"index": i, "finish_reason": reason, "text": text}
            for i, (text, reason) in enumerate(replies)
        ]
        return Completion.model_validate(self._envelope("text_completion", choices))

    async def health_check(self) -> bool:
        try:
            async with self._client().get(f"{self.root_url}/health/") as response:
                return bool(response.status == 200)
        except (TimeoutError, aiohttp.ClientError, InferenceError):
            return False

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        await super().close()

    # ---- one /generate/ request ---------------------------------------------------------

    async def _generate(self, prompt: str, kwargs: dict[str, Any]) -> list[tuple[str, str]]:
        """(text, finish reason) of each completion of ``prompt``."""
        self._warn_ignored(kwargs)
        max_tokens = kwargs.get("max_tokens") or kwargs.get("max_completion_tokens")
        body: dict[str, Any] = {"prompts": [prompt], "max_tokens": max_tokens or DEFAULT_MAX_TOKENS}
        body.update({k: kwargs[k] for k in SAMPLING_FIELDS if kwargs.get(k) is not None})
        url = f"{self.root_url}/generate/"
        try:
            async with self._client().post(url, json=body) as response:
                data = await response.json()
        except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError) as exc:
            raise InferenceError(f"{url}: {type(exc).__name__}: {exc}") from exc
        completions = data.get("completion_ids") if isinstance(data, dict) else None
        n = int(body.get("n", 1))
        if not _is_id_lists(completions) or len(completions) != n:
            raise InferenceError(f"{url}: expected {n} completion_ids lists, got {str(data)[:200]}")
        stops = _stop_strings(kwargs.get("stop"))
        return [self._reply(ids, body["max_tokens"], stops) for ids in completions]

    def _reply(self, ids: list[int], max_tokens: int, stops: list[str]) -> tuple[str, str]:
        text = str(self.tokenizer.decode(ids, skip_special_tokens=True))
        cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
        if cut >= 0:  # the server knows no stop strings: they are applied to the text here
            return text[:cut], "stop"
        ran_out = len(ids) >= max_tokens and (not ids or ids[-1] != self.tokenizer.eos_token_id)
        return text, "length" if ran_out else "stop"

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = (
                {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
            )
            self._session = aiohttp.ClientSession(
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.config.timeout),
                raise_for_status=_raise_for_status,
            )
        return self._session

    def _warn_ignored(self, kwargs: dict[str, Any]) -> None:
        ignored = {k for k, v in kwargs.items() if v is not None and k not in _HANDLED}
        if ignored - self._ignored:
            logger.warning("server_type trl: %s not supported by trl vllm-serve; ignored",
                           ", ".join(sorted(ignored - self._ignored)))  # fmt: skip
            self._ignored |= ignored

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": f"trl-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
                "model": self.config.model_name, "choices": choices}  # fmt: skip


async def _raise_for_status(response: aiohttp.ClientResponse) -> None:
    if response.status < 400:
        return
    detail = f"{response.url}: HTTP {response.status}: {(await response.text())[:300]}"
    if response.status < 500 and response.status not in (408, 429):
        raise InferenceRejectedError(detail)
    raise InferenceError(detail)


def _is_id_lists(value: Any) -> TypeGuard[list[list[int]]]:
    return isinstance(value, list) and all(
        isinstance(ids, list) and all(isinstance(i, int) for i in ids) for ids in value
    )


def _stop_strings(stop: Any) -> list[str]:
    if stop is None:
        return []
    return [s for s in ([stop] if isinstance(stop, str) else stop) if isinstance(s, str) and s]
