"""SGLang-shaped ``POST /generate`` (real SGLang and our embedded server): token ids in and out."""

from __future__ import annotations

from typing import Any

from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.server_baseline import (
    GeneratedSequence,
    token_versions,
    weight_version,
)
from atroposlib.errors import InferenceError

_SAMPLING_KEYS = {"max_tokens": "max_new_tokens", "max_new_tokens": "max_new_tokens"}
_PASSED_KEYS = ("temperature", "top_p", "top_k", "stop", "min_p", "seed", "stop_token_ids")


def sglang_sampling_params(sampling: dict[str, Any], n: int) -> dict[str, Any]:
    """OpenAI-style sampling kwargs as SGLang ``sampling_params``.

    >>> sglang_sampling_params({"max_tokens": 8, "temperature": 0.5, "logprobs": True}, 2)
    {'n': 2, 'max_new_tokens': 8, 'temperature': 0.5}
    """
    params: dict[str, Any] = {"n": n}
    for key, value in sampling.items():
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


class SGLangServer(OpenAIServer):
    """OpenAI endpoints for text; ``/generate`` for token ids and logprobs."""

    supports_token_ids = True

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

    async def _generate(self, body: dict[str, Any], n: int) -> list[GeneratedSequence]:
        data = await self.post_json(f"{self.root_url}/generate", body)
        entries = data if isinstance(data, list) else [data]
        if len(entries) != n:
            raise InferenceError(f"/generate returned {len(entries)} sequences, asked for {n}")
        return [parse_sglang_output(entry, len(body["input_ids"])) for entry in entries]


class EmbeddedServer(SGLangServer):
    """``python -m atroposlib.inference``: the same ``/generate`` shape as SGLang."""
