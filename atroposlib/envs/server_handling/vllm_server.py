"""vLLM backend: token ids via its OpenAI completions endpoint with a token-id prompt."""

from __future__ import annotations

import logging
from typing import Any

from openai.types import Completion
from openai.types.chat import ChatCompletion

from atroposlib.envs.constants import NAMESPACE_SEP, OPENAI_NAMESPACE
from atroposlib.envs.server_handling.openai_server import (
    openai_chat_completion,
    openai_completion,
    request_body,
    resolve_openai_configs,
)
from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    GeneratedSequence,
    ReasoningConfig,
    token_versions,
)
from atroposlib.errors import InferenceError

__all__ = [
    "NAMESPACE_SEP",
    "OPENAI_NAMESPACE",
    "APIServer",
    "APIServerConfig",
    "ReasoningConfig",
    "VLLMServer",
    "parse_prompt_logprobs",
    "parse_vllm_choice",
    "resolve_openai_configs",
]
_TOKEN_PREFIX = "token_id:"
logger = logging.getLogger(__name__)


def parse_vllm_choice(choice: Any, prompt_ids: list[int] | None = None) -> GeneratedSequence:
    """One ``/v1/completions`` choice requested with ``logprobs=0`` and token ids as tokens.

    vLLM 0.10.2+ also answers ``token_ids`` and ``prompt_token_ids`` (``return_token_ids``);
    prompt ids that differ from ``prompt_ids`` mean the engine did not continue from exactly
    the ids sent (InferenceError).
    """
    echoed = choice.get("prompt_token_ids") if isinstance(choice, dict) else None
    if prompt_ids is not None and echoed is not None and list(echoed) != prompt_ids:
        raise InferenceError(
            f"vLLM continued from {len(echoed)} prompt ids that differ from the "
            f"{len(prompt_ids)} sent"
        )
    try:
        logprobs = choice["logprobs"]
        values = [float(v) for v in logprobs["token_logprobs"]]
        ids = choice.get("token_ids")
        if ids is None:
            ids = [int(str(t).removeprefix(_TOKEN_PREFIX)) for t in logprobs["tokens"]]
        reason = choice.get("finish_reason") or "stop"
    except (KeyError, TypeError, ValueError) as exc:
        raise InferenceError(f"vLLM completion choice is malformed: {str(choice)[:200]}") from exc
    if len(ids) != len(values):
        raise InferenceError(f"vLLM returned {len(ids)} tokens but {len(values)} logprobs")
    versions = token_versions(choice.get("weight_versions"), len(ids))
    first = versions[0] if versions else None
    return GeneratedSequence(
        [int(i) for i in ids], values, str(reason), choice.get("text"), first, versions
    )


def parse_prompt_logprobs(entries: Any, input_ids: list[int]) -> list[list[tuple[int, float]]]:
    """vLLM's ``prompt_logprobs`` (``[null, {"id": {"logprob": x, ...}}, ...]``) as, per
    position, the prompt token's (id, logprob) then the other top-k entries.

    >>> parse_prompt_logprobs([None, {"9": {"logprob": -0.1}, "7": {"logprob": -0.5}}], [5, 7])
    [[], [(7, -0.5), (9, -0.1)]]
    """
    out: list[list[tuple[int, float]]] = []
    try:
        for index, token in enumerate(input_ids):
            entry = entries[index]
            if not entry:
                out.append([])
                continue
            scored = {int(k): float(v["logprob"] if isinstance(v, dict) else v)
                      for k, v in entry.items()}  # fmt: skip
            others = [(k, v) for k, v in scored.items() if k != token]
            out.append([(token, scored[token]), *others] if token in scored else others)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise InferenceError(f"vLLM prompt_logprobs are malformed: {str(entries)[:200]}") from exc
    return out


class VLLMServer(APIServer):
    """``POST /v1/completions`` with ``prompt: list[int]``, ``logprobs: 0``, token ids returned;
    text through its OpenAI endpoints. Not an OpenAIServer (nor is it in Atropos 0.4: envs test
    ``isinstance(server, OpenAIServer)`` to tell text-only servers from token servers).

    ``seed`` is never sent: vLLM's CPU build (0.32) kills its engine on a seeded request whose
    prefill it chunks ("CPU Generator does not use offset"), and every later request then fails;
    a client cannot tell a CPU build from a GPU one, so the seed is dropped with a warning.
    """

    supports_token_ids = True
    _warned_seed = False

    def _without_seed(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        if kwargs.get("seed") is None and "seed" not in (kwargs.get("extra_body") or {}):
            return kwargs
        if not self._warned_seed:
            self._warned_seed = True
            logger.warning(
                "seed not sent to vLLM at %s: a seeded request whose prefill vLLM chunks kills "
                "the engine of its CPU build; sampling stays random",
                self.base_url,
            )
        kept = {k: v for k, v in kwargs.items() if k != "seed"}
        if isinstance(kept.get("extra_body"), dict):
            kept["extra_body"] = {k: v for k, v in kept["extra_body"].items() if k != "seed"}
        return kept

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        return await openai_chat_completion(self, self._without_seed(kwargs))

    async def completion(self, **kwargs: Any) -> Completion:
        return await openai_completion(self, self._without_seed(kwargs))

    async def generate(
        self, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]:
        split = str(sampling.get("split", "train"))
        sampling = self._without_seed(sampling)
        kwargs = {k: v for k, v in sampling.items() if k not in ("max_new_tokens", "logprobs")}
        if "max_new_tokens" in sampling:
            kwargs.setdefault("max_tokens", sampling["max_new_tokens"])
        body = request_body(self.config.model_name, kwargs)
        body.update(
            prompt=input_ids,
            n=n,
            logprobs=0,
            return_tokens_as_token_ids=True,
            return_token_ids=True,
        )
        return await self.timed(split, self._generate(body, n))

    async def prompt_logprobs(
        self, input_ids: list[int], top_k: int
    ) -> list[list[tuple[int, float]]]:
        body = {"model": self.config.model_name, "prompt": input_ids, "max_tokens": 1,
                "temperature": 0.0, "prompt_logprobs": top_k}  # fmt: skip
        data = await self.post_json(f"{self.base_url}/completions", body)
        choices = data.get("choices") if isinstance(data, dict) else None
        if not choices or not isinstance(choices[0], dict):
            raise InferenceError(f"vLLM returned no choice for prompt logprobs: {str(data)[:200]}")
        return parse_prompt_logprobs(choices[0].get("prompt_logprobs"), input_ids)

    async def _generate(self, body: dict[str, Any], n: int) -> list[GeneratedSequence]:
        data = await self.post_json(f"{self.base_url}/completions", body)
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or len(choices) != n:
            raise InferenceError(f"vLLM returned {len(choices or [])} choices, asked for {n}")
        ordered = sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
        prompt = body["prompt"]
        return [parse_vllm_choice(choice, prompt) for choice in ordered]
