"""``--testing``: an in-process server with canned answers, so an env runs with no inference."""

from __future__ import annotations

import time
from typing import Any

from openai.types import Completion
from openai.types.chat import ChatCompletion

from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    GeneratedSequence,
)


class ServerHarness(APIServer):
    """Answers every request locally: ``"test response <i>"``, token ids 1..k, logprobs -1."""

    supports_token_ids = True

    def __init__(self, config: APIServerConfig | None = None) -> None:
        super().__init__(config or APIServerConfig(base_url="harness://local", health_check=False))

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        n = int(kwargs.get("n") or 1)
        choices = [
            {
                "index": i,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": f"test response {i}"},
            }
            for i in range(n)
        ]
        return ChatCompletion.model_validate(self._envelope("chat.completion", choices))

    async def completion(self, **kwargs: Any) -> Completion:
        n = int(kwargs.get("n") or 1)
        choices = [
            {"index": i, "finish_reason": "stop", "text": f"test response {i}"} for i in range(n)
        ]
        return Completion.model_validate(self._envelope("text_completion", choices))

    async def generate(
        self, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]:
        length = max(
            1, min(8, int(sampling.get("max_tokens") or sampling.get("max_new_tokens") or 8))
        )
        return [
            GeneratedSequence([1 + (i + j) % 50 for j in range(length)], [-1.0] * length, "stop")
            for i in range(n)
        ]

    async def health_check(self) -> bool:
        return True

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": "harness",
            "object": kind,
            "created": int(time.time()),
            "model": self.config.model_name,
            "choices": choices,
        }
