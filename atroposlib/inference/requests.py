"""Turning HTTP request bodies into token ids and sampling settings, with 4xx on misuse."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from fastapi import HTTPException
from jinja2 import TemplateError

from atroposlib.inference.batch import Sequence
from atroposlib.inference.engine import ModelRunner
from atroposlib.inference.sampling import SamplingParams
from atroposlib.inference.tool_calls import template_message
from atroposlib.wire.openai import ChatMessageIn


def bad_request(field: str, message: str, status_code: int = 400) -> HTTPException:
    return HTTPException(status_code=status_code, detail=f"{field}: {message}")


def stop_conditions(
    runner: ModelRunner,
    stop: str | int | list[str | int] | None,
    stop_token_ids: list[int] | None,
    prefix: str = "",
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Stop strings and stop token ids; ``stop`` may hold either (Atropos sends eos ids)."""
    given = [] if stop is None else [stop] if isinstance(stop, str | int) else stop
    strings = tuple(s for s in given if isinstance(s, str))
    if any(not s for s in strings):
        raise bad_request(f"{prefix}stop", "stop strings must be non-empty", 422)
    ids = tuple(t for t in given if isinstance(t, int))
    for field, values in ((f"{prefix}stop", ids), (f"{prefix}stop_token_ids", stop_token_ids)):
        _check_vocabulary(runner, values or (), field)
    return strings, ids + tuple(stop_token_ids or ())


def _check_vocabulary(runner: ModelRunner, ids: Iterable[int], field: str) -> None:
    vocab = runner.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise bad_request(field, f"token id {bad} is outside the vocabulary [0, {vocab})", 422)


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
    for ids in prompts:
        _check_vocabulary(runner, ids, field)
    return prompts


def chat_prompt(
    runner: ModelRunner,
    messages: list[ChatMessageIn],
    tools: list[dict[str, Any]] | None = None,
    template: str | None = None,
) -> list[int]:
    """Render ``messages`` (and ``tools``, for templates that list them) with the chat
    template (``template``, else the model's), ready for the assistant's turn."""
    if template is None and runner.tokenizer.chat_template is None:
        raise bad_request("model", "the served model has no chat template; use /v1/completions")
    plain = [template_message(message.model_dump(exclude_none=True)) for message in messages]
    for i, message in enumerate(plain):
        if isinstance(message.get("content"), list):
            message["content"] = _text_of(message["content"], f"messages[{i}].content")
    options: dict[str, Any] = {"tools": tools} if tools else {}
    if template is not None:
        options["chat_template"] = template
    try:
        rendered = runner.tokenizer.apply_chat_template(
            plain, tokenize=False, add_generation_prompt=True, **options
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
