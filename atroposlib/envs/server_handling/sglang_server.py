"""SGLang-shaped ``POST /generate`` (real SGLang and our embedded server): token ids in and out."""

from __future__ import annotations

from typing import Any

from openai.types import Completion
from openai.types.chat import ChatCompletion

from atroposlib.envs.constants import NAMESPACE_SEP, OPENAI_NAMESPACE
from atroposlib.envs.server_handling.openai_server import (
    openai_chat_completion,
    openai_completion,
    resolve_openai_configs,
)
from atroposlib.envs.server_handling.reasoning import split_stop
from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    GeneratedSequence,
    ReasoningConfig,
)
from atroposlib.envs.server_handling.weight_versions import token_versions, weight_version
from atroposlib.errors import InferenceError

__all__ = [
    "NAMESPACE_SEP",
    "OPENAI_NAMESPACE",
    "APIServer",
    "APIServerConfig",
    "EmbeddedServer",
    "ReasoningConfig",
    "SGLangServer",
    "parse_input_logprobs",
    "parse_sglang_output",
    "resolve_openai_configs",
    "sglang_sampling_params",
]
_SAMPLING_KEYS = {"max_tokens": "max_new_tokens", "max_new_tokens": "max_new_tokens"}
_PASSED_KEYS = (
    "temperature", "top_p", "top_k", "stop", "min_p", "seed", "stop_token_ids", "ignore_eos",
)  # fmt: skip


def sglang_sampling_params(sampling: dict[str, Any], n: int) -> dict[str, Any]:
    """OpenAI-style sampling kwargs as SGLang ``sampling_params``.

    >>> sglang_sampling_params({"max_tokens": 8, "temperature": 0.5, "logprobs": True}, 2)
    {'n': 2, 'max_new_tokens': 8, 'temperature': 0.5}
    """
    params: dict[str, Any] = {"n": n}
    for key, value in split_stop(sampling).items():
        if value is None:
            continue
        if key in _SAMPLING_KEYS:
            params[_SAMPLING_KEYS[key]] = value
        elif key in _PASSED_KEYS:
            params[key] = value
    return params


def parse_sglang_output(entry: Any, prompt_length: int | None = None) -> GeneratedSequence:
    """One ``/generate`` answer entry; InferenceError when it is malformed.

    ``prompt_length``: the ids sent; an engine that reports another prompt length did not
    continue from exactly those ids (InferenceError).
    """
    try:
        meta = entry["meta_info"]
        reported = meta.get("prompt_tokens")
        if prompt_length is not None and reported is not None and reported != prompt_length:
            raise InferenceError(
                f"/generate saw {reported} prompt tokens but {prompt_length} were sent"
            )
        pairs = meta["output_token_logprobs"]
        logprobs = [float(pair[0]) for pair in pairs]
        output_ids = [int(i) for i in entry.get("output_ids") or [pair[1] for pair in pairs]]
        finish = meta.get("finish_reason") or {}
        reason = finish.get("type", "stop") if isinstance(finish, dict) else str(finish)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise InferenceError(f"/generate answer is malformed: {str(entry)[:200]}") from exc
    if len(output_ids) != len(logprobs):
        raise InferenceError(
            f"/generate returned {len(output_ids)} tokens but {len(logprobs)} logprobs"
        )
    per_token = token_versions(meta.get("weight_versions"), len(output_ids))
    version = weight_version(meta.get("weight_version"))
    if per_token:
        version = per_token[0]
    return GeneratedSequence(output_ids, logprobs, reason, entry.get("text"), version, per_token)


def _position(entry: Any) -> tuple[int, float] | None:
    if not isinstance(entry, list | tuple) or len(entry) < 2 or entry[0] is None:
        return None
    return int(entry[1]), float(entry[0])


def parse_input_logprobs(meta: Any, input_ids: list[int]) -> list[list[tuple[int, float]]]:
    """SGLang's ``input_token_logprobs`` / ``input_top_logprobs`` as, per prompt position, the
    prompt token's (id, logprob) then the other top-k entries; position 0 is empty.

    >>> meta = {"input_token_logprobs": [[None, 5, None], [-0.5, 7, None]],
    ...         "input_top_logprobs": [None, [[-0.1, 9, None], [-0.5, 7, None]]]}
    >>> parse_input_logprobs(meta, [5, 7])
    [[], [(7, -0.5), (9, -0.1)]]
    """
    try:
        chosen = meta["input_token_logprobs"]
        tops = meta.get("input_top_logprobs") or [None] * len(chosen)
        out: list[list[tuple[int, float]]] = []
        for index, token in enumerate(input_ids):
            own = _position(chosen[index])
            if own is None:
                out.append([])
                continue
            others = [p for p in map(_position, tops[index] or []) if p and p[0] != token]
            out.append([(token, own[1]), *others])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise InferenceError(f"/generate prompt logprobs are malformed: {str(meta)[:200]}") from exc
    return out


class SGLangServer(APIServer):
    """OpenAI endpoints for text; ``/generate`` for token ids and logprobs. Not an
    OpenAIServer, as in Atropos 0.4 (see VLLMServer)."""

    supports_token_ids = True

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        return await openai_chat_completion(self, kwargs)

    async def completion(self, **kwargs: Any) -> Completion:
        return await openai_completion(self, kwargs)

    async def generate(
        self, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]:
        split = str(sampling.get("split", "train"))
        body = {
            "input_ids": input_ids,
            "sampling_params": sglang_sampling_params(sampling, n),
            "return_logprob": True,
        }
        data = await self.timed(split, self._generate(body, n))
        return data

    async def prompt_logprobs(
        self, input_ids: list[int], top_k: int
    ) -> list[list[tuple[int, float]]]:
        body = {
            "input_ids": input_ids,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": top_k,
        }
        data = await self.post_json(f"{self.root_url}/generate", body)
        entry = data[0] if isinstance(data, list) and data else data
        meta = entry.get("meta_info") if isinstance(entry, dict) else None
        return parse_input_logprobs(meta, input_ids)

    async def _generate(self, body: dict[str, Any], n: int) -> list[GeneratedSequence]:
        data = await self.post_json(f"{self.root_url}/generate", body)
        entries = data if isinstance(data, list) else [data]
        if len(entries) != n:
            raise InferenceError(f"/generate returned {len(entries)} sequences, asked for {n}")
        return [parse_sglang_output(entry, len(body["input_ids"])) for entry in entries]


class EmbeddedServer(SGLangServer):
    """``python -m atroposlib.inference``: the same ``/generate`` shape as SGLang."""
