"""vLLM backend: token ids in and out through ``/inference/v1/generate`` (served with
``--enable-scale-out``), which reports the weight version that sampled each token; vLLM's
OpenAI completions endpoint with a token-id prompt where that route is absent."""

from __future__ import annotations

import logging
from dataclasses import replace
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
)
from atroposlib.envs.server_handling.weight_versions import token_versions, weight_version
from atroposlib.errors import InferenceError, InferenceRejectedError

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
TOKENS_ROUTE = "/inference/v1/generate"
SAMPLING_FIELDS = frozenset((
    "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p",
    "top_k", "min_p", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "min_tokens",
    "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
    "logit_bias", "allowed_token_ids", "bad_words", "structured_outputs", "extra_args",
))  # fmt: skip
"""vLLM ``SamplingParams`` fields an env may set through the token route (``n`` and
``logprobs`` are the client's; vLLM ignores names it does not know, so ours refuses them)."""
logger = logging.getLogger(__name__)


def parse_tokens_choice(choice: Any) -> GeneratedSequence:
    """One choice of ``/inference/v1/generate`` (``output_mode`` tokens, ``logprobs`` 0): ids,
    the sampled tokens' logprobs and the weight version spans over the output."""
    try:
        ids = [int(i) for i in choice["token_ids"] or []]
        content = (choice.get("logprobs") or {}).get("content") or []
        values = [float(entry["logprob"]) for entry in content]
        reason = choice.get("finish_reason") or "stop"
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InferenceError(f"vLLM generate choice is malformed: {str(choice)[:200]}") from exc
    if len(ids) != len(values):
        raise InferenceError(f"vLLM returned {len(ids)} tokens but {len(values)} logprobs")
    spans = choice.get("weight_versions")
    unnamed = _unnumbered_label(spans)
    if unnamed is not None:
        why = f"vLLM labels its weights {unnamed!r}, not a trainer step"
        return GeneratedSequence(ids, values, str(reason), versions_unknown=why)
    versions = token_versions(spans, len(ids))
    first = versions[0] if versions else None
    return GeneratedSequence(ids, values, str(reason), None, first, versions)


def _unnumbered_label(spans: Any) -> str | None:
    """A span's version label that names no step (someone labelled vLLM by hand), if any."""
    for span in spans if isinstance(spans, list) else []:
        label = span.get("version") if isinstance(span, dict) else None
        if isinstance(label, str) and weight_version(label) is None:
            return label
    return None


def _route_closed(error: InferenceRejectedError) -> bool:
    """Whether vLLM refused the token route itself: 0.32 without ``--enable-scale-out``
    answers 403 "Scale-out endpoints are disabled", a vLLM older than the route 404."""
    said = str(error)
    return (error.status == 403 and "--enable-scale-out" in said) or (
        error.status == 404 and "Not Found" in said
    )


def sampling_body(model: str, sampling: dict[str, Any]) -> dict[str, Any]:
    """An env's sampling kwargs as an OpenAI request body for ``model`` (``max_new_tokens``
    read as ``max_tokens``; ``logprobs`` left to the caller, which always asks for them)."""
    kwargs = {k: v for k, v in sampling.items() if k not in ("max_new_tokens", "logprobs")}
    if "max_new_tokens" in sampling:
        kwargs.setdefault("max_tokens", sampling["max_new_tokens"])
    return request_body(model, kwargs)


def tokens_route_body(
    input_ids: list[int], n: int, sampling: dict[str, Any], model: str
) -> dict[str, Any]:
    """The ``/inference/v1/generate`` body for an env's sampling kwargs (OpenAI names, as the
    completions path takes them); an InferenceRejectedError names a kwarg vLLM would drop."""
    params = sampling_body(model, sampling)
    params.pop("model")
    unknown = sorted(set(params) - SAMPLING_FIELDS)
    if unknown:
        raise InferenceRejectedError(
            f"sampling parameters {unknown} are not vLLM SamplingParams fields, which "
            f"{TOKENS_ROUTE} takes (vLLM would ignore them): use its names, e.g. max_tokens"
        )
    params.update(n=n, logprobs=0)
    return {"model": model, "token_ids": input_ids, "sampling_params": params}


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
    """Token ids through ``POST /inference/v1/generate`` (token ids in and out, each output
    token's weight version); text through its OpenAI endpoints. Not an OpenAIServer (nor is it
    in Atropos 0.4: envs test ``isinstance(server, OpenAIServer)`` to tell text-only servers
    from token servers).

    A vLLM served without ``--enable-scale-out`` refuses that route (403; one older than the
    route answers 404): the server then samples through ``/v1/completions`` (``prompt:
    list[int]``, ``logprobs: 0``), which carries no weight versions, says so once in the log,
    and its sequences carry none (``versions_unknown`` names why; the group's
    ``policy_versions`` stay unset).

    ``seed`` is never sent: vLLM's CPU build (0.32) kills its engine on a seeded request whose
    prefill it chunks ("CPU Generator does not use offset"), and every later request then fails;
    a client cannot tell a CPU build from a GPU one, so the seed is dropped with a warning.
    """

    supports_token_ids = True
    _warned_seed = False
    versions_unknown: str | None = None
    """Why this server's sequences carry no weight versions (None: they do, or not tried)."""

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
        if self.versions_unknown is None:
            try:
                sampled = self._generate_tokens(input_ids, n, sampling)
                return await self.timed(split, sampled)
            except InferenceRejectedError as exc:
                if not _route_closed(exc):
                    raise
                self.versions_unknown = (
                    f"vLLM at {self.root_url} has no {TOKENS_ROUTE} (serve it with "
                    "--enable-scale-out): sampled through /v1/completions, which reports no "
                    "weight versions"
                )
                logger.warning("%s", self.versions_unknown)
        body = sampling_body(self.config.model_name, sampling)
        body.update(
            prompt=input_ids,
            n=n,
            logprobs=0,
            return_tokens_as_token_ids=True,
            return_token_ids=True,
        )
        completions = await self.timed(split, self._generate(body, n))
        return [replace(s, versions_unknown=self.versions_unknown) for s in completions]

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

    async def _generate_tokens(
        self, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]:
        body = tokens_route_body(input_ids, n, sampling, self.config.model_name)
        data = await self.post_json(f"{self.root_url}{TOKENS_ROUTE}", body)
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or len(choices) != n:
            raise InferenceError(f"vLLM returned {len(choices or [])} choices, asked for {n}")
        ordered = sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
        return [parse_tokens_choice(choice) for choice in ordered]

    async def _generate(self, body: dict[str, Any], n: int) -> list[GeneratedSequence]:
        data = await self.post_json(f"{self.base_url}/completions", body)
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or len(choices) != n:
            raise InferenceError(f"vLLM returned {len(choices or [])} choices, asked for {n}")
        ordered = sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
        prompt = body["prompt"]
        return [parse_vllm_choice(choice, prompt) for choice in ordered]
