"""``/v1/completions``, ``/v1/chat/completions`` and ``/v1/models`` in OpenAI's shapes.

``stream: true`` answers server-sent events (:mod:`~atroposlib.inference.streaming`);
a client that disconnects has its generation cancelled before the next decode step.
"""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request, Response

from atroposlib.inference.batch import Sequence
from atroposlib.inference.limits import check_request_size
from atroposlib.inference.openai_format import (
    chat_logprobs,
    completion_logprobs,
    finish_reason,
    usage,
)
from atroposlib.inference.requests import (
    bad_request,
    budget,
    chat_prompt,
    prompt_batch,
    sequences,
    stop_conditions,
)
from atroposlib.inference.sampling import SamplingParams
from atroposlib.inference.serving import run_job
from atroposlib.inference.state import ServerState, server_state
from atroposlib.inference.streaming import (
    StreamedRequest,
    chat_events,
    completion_events,
    sse_response,
)
from atroposlib.inference.tool_calls import chosen_format, reply_message
from atroposlib.wire.openai import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    OpenAISamplingFields,
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


@router.post("/completions", response_model=CompletionResponse)
async def completions(body: CompletionRequest, request: Request) -> CompletionResponse | Response:
    state = server_state(request)
    _check_common(state, body)
    if body.echo:
        raise bad_request("echo", "echo is not supported by the embedded server; set it false")
    prompts = prompt_batch(state.runner, body.prompt, "prompt")
    limits = [budget(state.runner, len(ids), body.max_tokens, "max_tokens") for ids in prompts]
    check_request_size(state.settings, "prompt", limits, body.n, "max_tokens")
    params = _params(state, body, top_logprobs=body.logprobs or 0)
    prompt_tokens = sum(len(ids) for ids in prompts)
    todo = sequences(prompts, body.n, params, limits)
    if body.stream:
        logprobs = body.logprobs is not None
        stream = _streamed(request, state, body, todo, prompt_tokens, logprobs)
        return sse_response(completion_events(stream))
    done = await run_job(request, state.scheduler, todo)
    if isinstance(done, Response):
        return done
    state.sample_log.record(done)
    choices = [
        CompletionChoice(
            index=i,
            text=seq.text,
            logprobs=completion_logprobs(state, seq.output_ids, seq.logprobs, _top(seq))
            if body.logprobs is not None
            else None,
            finish_reason=finish_reason(seq.finish_reason) or "stop",
            token_ids=seq.output_ids,
        )
        for i, seq in enumerate(done)
    ]
    return CompletionResponse(
        id=f"cmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=body.model,
        choices=choices,
        usage=usage(prompt_tokens, done),
    )


@router.post("/chat/completions", response_model=ChatCompletionResponse)
async def chat_completions(
    body: ChatCompletionRequest, request: Request
) -> ChatCompletionResponse | Response:
    state = server_state(request)
    _check_common(state, body)
    if body.top_logprobs and not body.logprobs:
        raise bad_request("top_logprobs", "top_logprobs needs logprobs set to true")
    prompt = chat_prompt(state.runner, body.messages, body.tools, state.chat_template)
    max_new = body.max_completion_tokens or body.max_tokens
    field = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    limit = budget(state.runner, len(prompt), max_new, field)
    check_request_size(state.settings, "messages", [limit], body.n, field)
    params = _params(state, body, top_logprobs=body.top_logprobs or 0)
    todo = sequences([prompt], body.n, params, [limit])
    calls_format = chosen_format(state.settings.tool_call_parser, body.tools, body.tool_choice)
    if body.stream:
        stream = _streamed(request, state, body, todo, len(prompt), body.logprobs)
        return sse_response(chat_events(stream, calls_format))
    done = await run_job(request, state.scheduler, todo)
    if isinstance(done, Response):
        return done
    state.sample_log.record(done)
    messages = [reply_message(seq.text, calls_format) for seq in done]
    choices = [
        ChatChoice(
            index=i,
            message=message,
            logprobs=chat_logprobs(state, seq.output_ids, seq.logprobs, _top(seq))
            if body.logprobs
            else None,
            finish_reason="tool_calls"
            if message.tool_calls
            else finish_reason(seq.finish_reason) or "stop",
            token_ids=seq.output_ids,
        )
        for i, (seq, message) in enumerate(zip(done, messages, strict=True))
    ]
    return ChatCompletionResponse(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=body.model,
        choices=choices,
        usage=usage(len(prompt), done),
        prompt_token_ids=prompt,
    )


def _check_common(state: ServerState, body: OpenAISamplingFields) -> None:
    if body.model not in state.model_names:
        raise bad_request(
            "model",
            f"model {body.model!r} is not served here; use one of {state.model_names}",
            status_code=404,
        )


def _streamed(
    request: Request,
    state: ServerState,
    body: OpenAISamplingFields,
    todo: list[Sequence],
    prompt_tokens: int,
    logprobs: bool,
) -> StreamedRequest:
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return StreamedRequest(request, state, todo, body.model, prompt_tokens, logprobs, include_usage)


def _params(state: ServerState, body: OpenAISamplingFields, top_logprobs: int) -> SamplingParams:
    stop, stop_ids = stop_conditions(state.runner, body.stop, body.stop_token_ids)
    return SamplingParams(
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=max(body.top_k, 0),
        min_p=body.min_p,
        stop=stop,
        stop_token_ids=stop_ids,
        ignore_eos=body.ignore_eos,
        seed=body.seed,
        top_logprobs=top_logprobs,
    )


def _top(seq: Sequence) -> list[list[tuple[int, float]]] | None:
    return seq.top_logprobs if seq.params.top_logprobs else None
