"""Turning HTTP request bodies into token ids and sampling settings, with 4xx on misuse."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fastapi import HTTPException
from jinja2 import TemplateError

from atroposlib.inference.batch import Sequence
from atroposlib.inference.engine import ModelRunner
from atroposlib.inference.sampling import SamplingParams
from atroposlib.protocol import ChatMessageIn


def bad_request(field: str, message: str, status_code: int = 400) -> HTTPException:
    return HTTPException(status_code=status_code, detail=f"{field}: {message}")


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    strings = (stop,) if isinstance(stop, str) else tuple(stop)
    if any(not s for s in strings):
        raise bad_request("stop", "stop strings must be non-empty")
    return strings


def prompt_batch(
    runner: ModelRunner, prompt: str | list[str] | list[int] | list[list[int]], field: str
) -> list[list[int]]:
    """Token ids of each prompt: text is tokenized, ids are checked against the vocabulary."""
    if isinstance(prompt, str):
        prompts: list[list[int]] = [runner.tokenizer.encode(prompt)]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [list(prompt)]  # type: ignore[arg-type]
    else:
        prompts = [
            runner.tokenizer.encode(p) if isinstance(p, str) else list(p)  # type: ignore[arg-type]
            for p in prompt
        ]
    if not prompts or any(not ids for ids in prompts):
        raise bad_request(field, "every prompt needs at least one token")
    vocab = runner.vocab_size
    for ids in prompts:
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise bad_request(field, f"token id {bad[0]} is outside the vocabulary [0, {vocab})")
    return prompts


def chat_prompt(runner: ModelRunner, messages: list[ChatMessageIn]) -> list[int]:
    """Render ``messages`` with the model's chat template, ready for the assistant's turn."""
    if runner.tokenizer.chat_template is None:
        raise bad_request("model", "the served model has no chat template; use /v1/completions")
    plain = [message.model_dump(exclude_none=True) for message in messages]
    for i, message in enumerate(plain):
        if isinstance(message.get("content"), list):
            message["content"] = _text_of(message["content"], f"messages[{i}].content")
    try:
        rendered = runner.tokenizer.apply_chat_template(
            plain, tokenize=False, add_generation_prompt=True
        )
    except TemplateError as error:
        raise bad_request("messages", f"the chat template rejected them: {error}") from error
    return list(runner.tokenizer.encode(str(rendered), add_special_tokens=False))


def _text_of(parts: list[dict[str, Any]], field: str) -> str:
    """The text of OpenAI content parts; this server reads text parts only."""
    if any(part.get("type") != "text" or not isinstance(part.get("text"), str) for part in parts):
        raise bad_request(field, "only text parts ({'type': 'text', 'text': ...}) are supported")
    return "".join(part["text"] for part in parts)


def budget(runner: ModelRunner, prompt_len: int, max_new: int | None, field: str) -> int:
    """The number of new tokens to allow; 4xx if the prompt plus ``max_new`` overflow."""
    room = runner.context_length - prompt_len
    if room < 1:
        raise bad_request(
            "prompt",
            f"the prompt has {prompt_len} tokens, the model's context is "
            f"{runner.context_length}; shorten the prompt",
        )
    if max_new is None:
        return room
    if max_new > room:
        raise bad_request(
            field,
            f"{max_new} new tokens after a {prompt_len}-token prompt exceed the context of "
            f"{runner.context_length} tokens; set {field} to at most {room}",
        )
    return max_new


def sequences(
    prompts: list[list[int]], n: int, params: SamplingParams, max_new: list[int]
) -> list[Sequence]:
    """``n`` sequences per prompt, prompt-major; a seed ``s`` gives choice ``k`` seed ``s+k``."""
    out = []
    for p, ids in enumerate(prompts):
        for k in range(n):
            seed = None if params.seed is None else params.seed + p * n + k
            settings = replace(params, max_new_tokens=max_new[p], seed=seed)
            out.append(Sequence(list(ids), settings))
    return out
