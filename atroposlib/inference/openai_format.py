"""OpenAI's response pieces built from generated tokens: logprobs, usage, finish reasons.

Shared by the whole answers of :mod:`~atroposlib.inference.openai_api` and the chunks of
:mod:`~atroposlib.inference.streaming`.
"""

from __future__ import annotations

from atroposlib.inference.batch import Sequence
from atroposlib.inference.state import ServerState
from atroposlib.wire.openai import (
    ChoiceLogprobs,
    CompletionLogprobs,
    OpenAIFinishReason,
    TokenLogprob,
    TopLogprob,
    Usage,
)

TopLogprobs = list[list[tuple[int, float]]]


def finish_reason(reason: str | None) -> OpenAIFinishReason | None:
    """OpenAI's finish reason: ``length`` when cut by max_tokens, ``abort`` when a pause in
    abort mode ended it (vLLM's name), else ``stop``."""
    if reason is None:
        return None
    return reason if reason in ("length", "abort") else "stop"  # type: ignore[return-value]


def usage(prompt_tokens: int, done: list[Sequence]) -> Usage:
    completion = sum(len(seq.output_ids) for seq in done)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion,
        total_tokens=prompt_tokens + completion,
    )


def completion_logprobs(
    state: ServerState,
    token_ids: list[int],
    logprobs: list[float],
    top: TopLogprobs | None,
    offset: int = 0,
) -> CompletionLogprobs:
    """``/v1/completions`` logprobs; ``offset``: where these tokens' text starts."""
    pieces = [state.token_text(t) for t in token_ids]
    offsets = []
    for piece in pieces:
        offsets.append(offset)
        offset += len(piece)
    top_maps = None
    if top is not None:
        top_maps = [{state.token_text(t): lp for t, lp in step} for step in top]
    return CompletionLogprobs(
        tokens=pieces, token_logprobs=logprobs, top_logprobs=top_maps, text_offset=offsets
    )


def chat_logprobs(
    state: ServerState, token_ids: list[int], logprobs: list[float], top: TopLogprobs | None
) -> ChoiceLogprobs:
    """``/v1/chat/completions`` logprobs (``top``: None when top_logprobs was not asked)."""
    content = []
    for i, (token, logprob) in enumerate(zip(token_ids, logprobs, strict=True)):
        alternatives = top[i] if top else []
        content.append(
            TokenLogprob(
                **_top(state, token, logprob).model_dump(),
                top_logprobs=[_top(state, t, lp) for t, lp in alternatives],
            )
        )
    return ChoiceLogprobs(content=content)


def _top(state: ServerState, token: int, logprob: float) -> TopLogprob:
    text = state.token_text(token)
    return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))
