"""``/v1/completions``, ``/v1/chat/completions`` and ``/v1/models`` in OpenAI's shapes."""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request

from atroposlib.inference.batch import Sequence
from atroposlib.inference.requests import (
    bad_request,
    budget,
    chat_prompt,
    prompt_batch,
    sequences,
    stop_strings,
)
from atroposlib.inference.sampling import SamplingParams
from atroposlib.inference.state import ServerState, server_state
from atroposlib.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessageOut,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    OpenAISamplingFields,
    TokenLogprob,
    TopLogprob,
    Usage,
)

router = APIRouter(prefix="/v1")


@router.get("/models")
async def list_models(request: Request) -> ModelList:
    state = server_state(request)
    cards = [
        ModelCard(
            id=name,
            created=state.started,
            root=str(state.settings.model),
            max_model_len=state.runner.context_length,
        )
        for name in state.model_names
    ]
    return ModelList(data=cards)


@router.post("/completions")
async def completions(body: CompletionRequest, request: Request) -> CompletionResponse:
    state = server_state(request)
    _check_common(state, body)
    if body.echo:
        raise bad_request("echo", "echo is not supported by the embedded server; set it false")
    prompts = prompt_batch(state.runner, body.prompt, "prompt")
    limits = [budget(state.runner, len(ids), body.max_tokens, "max_tokens") for ids in prompts]
    params = _params(body, top_logprobs=body.logprobs or 0)
    done = await state.scheduler.generate(sequences(prompts, body.n, params, limits))
    state.sample_log.record(done)
    choices = [
        CompletionChoice(
            index=i,
            text=seq.text,
            logprobs=_completion_logprobs(state, seq) if body.logprobs is not None else None,
            finish_reason=_finish(seq),
            token_ids=seq.output_ids,
        )
        for i, seq in enumerate(done)
    ]
    return CompletionResponse(
        id=f"cmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=body.model,
        choices=choices,
        usage=_usage(sum(len(ids) for ids in prompts), done),
    )


@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> ChatCompletionResponse:
    state = server_state(request)
    _check_common(state, body)
    if body.top_logprobs and not body.logprobs:
        raise bad_request("top_logprobs", "top_logprobs needs logprobs set to true")
    prompt = chat_prompt(state.runner, body.messages)
    max_new = body.max_completion_tokens or body.max_tokens
    field = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    limit = budget(state.runner, len(prompt), max_new, field)
    params = _params(body, top_logprobs=body.top_logprobs or 0)
    done = await state.scheduler.generate(sequences([prompt], body.n, params, [limit]))
    state.sample_log.record(done)
    choices = [
        ChatChoice(
            index=i,
            message=ChatMessageOut(content=seq.text),
            logprobs=_chat_logprobs(state, seq) if body.logprobs else None,
            finish_reason=_finish(seq),
            token_ids=seq.output_ids,
        )
        for i, seq in enumerate(done)
    ]
    return ChatCompletionResponse(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=body.model,
        choices=choices,
        usage=_usage(len(prompt), done),
        prompt_token_ids=prompt,
    )


def _check_common(state: ServerState, body: OpenAISamplingFields) -> None:
    if body.model not in state.model_names:
        raise bad_request(
            "model",
            f"model {body.model!r} is not served here; use one of {state.model_names}",
            status_code=404,
        )
    if body.stream:
        raise bad_request("stream", "streaming is not supported by the embedded server")


def _params(body: OpenAISamplingFields, top_logprobs: int) -> SamplingParams:
    return SamplingParams(
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=max(body.top_k, 0),
        min_p=body.min_p,
        stop=stop_strings(body.stop),
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos,
        seed=body.seed,
        top_logprobs=top_logprobs,
    )


def _finish(seq: Sequence) -> str:
    return "length" if seq.finish_reason == "length" else "stop"


def _usage(prompt_tokens: int, done: list[Sequence]) -> Usage:
    completion = sum(len(seq.output_ids) for seq in done)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion,
        total_tokens=prompt_tokens + completion,
    )


def _completion_logprobs(state: ServerState, seq: Sequence) -> CompletionLogprobs:
    pieces = [state.token_text(t) for t in seq.output_ids]
    offsets, position = [], 0
    for piece in pieces:
        offsets.append(position)
        position += len(piece)
    top = None
    if seq.params.top_logprobs:
        top = [{state.token_text(t): lp for t, lp in step} for step in seq.top_logprobs]
    return CompletionLogprobs(
        tokens=pieces, token_logprobs=seq.logprobs, top_logprobs=top, text_offset=offsets
    )


def _chat_logprobs(state: ServerState, seq: Sequence) -> ChoiceLogprobs:
    content = []
    for i, (token, logprob) in enumerate(zip(seq.output_ids, seq.logprobs, strict=True)):
        alternatives = seq.top_logprobs[i] if seq.params.top_logprobs else []
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
