"""``stream: true``: OpenAI's server-sent events for chat completions and completions.

Every decode step that adds tokens to a choice sends one chunk for that choice. Its text
is decoded incrementally, holding back what could still become a stop string or is an
incomplete UTF-8 character, so the pieces join into exactly the text the same request
answers without streaming (with tools and a parser, ``tool_calls.StreamedCalls`` splits it
into content and calls). The stream ends with ``data: [DONE]``; a failure after the response
has started is sent as a last ``data: {"error": ...}`` event, as OpenAI does.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from atroposlib.inference.batch import Sequence
from atroposlib.inference.jobs import JobCancelled, SequenceUpdate
from atroposlib.inference.openai_format import (
    TopLogprobs,
    chat_logprobs,
    completion_logprobs,
    finish_reason,
    usage,
)
from atroposlib.inference.serving import cancelled_on_disconnect
from atroposlib.inference.state import ServerState
from atroposlib.inference.tool_calls import StreamedCalls, ToolCallFormat
from atroposlib.wire.openai import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    CompletionChunk,
    CompletionChunkChoice,
    StreamError,
    Usage,
)

logger = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


class TextPieces:
    """The text of one choice, released piece by piece as its token ids arrive."""

    def __init__(self, decode: Callable[[list[int]], str], holdback: int) -> None:
        self._decode = decode
        self._holdback = holdback
        self._ids: list[int] = []
        self._sent = 0
        self.offset = 0
        """Characters of the tokens seen so far (``text_offset`` of completion logprobs)."""

    def push(self, update: SequenceUpdate) -> str:
        self._ids += update.token_ids
        if update.finish_reason is not None:
            text = update.text  # final: stop strings already cut off
        else:
            text = self._decode(self._ids).rstrip("\ufffd")
            text = text[: max(len(text) - self._holdback, 0)]
        piece = text[self._sent :]
        self._sent = max(self._sent, len(text))
        return piece


def event(model: BaseModel) -> bytes:
    return b"data: " + model.model_dump_json().encode() + b"\n\n"


def sse_response(events: AsyncIterator[bytes]) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


@dataclass(frozen=True)
class StreamedRequest:
    """What both OpenAI routes hand over to stream a request's choices."""

    request: Request
    state: ServerState
    todo: list[Sequence]
    model: str
    prompt_tokens: int
    logprobs: bool
    include_usage: bool

    def header(self, id_prefix: str) -> dict[str, Any]:
        """The fields every chunk of this stream repeats."""
        ident = f"{id_prefix}-{uuid.uuid4().hex}"
        return {"id": ident, "created": int(time.time()), "model": self.model}

    def top_logprobs(self, update: SequenceUpdate) -> TopLogprobs | None:
        return update.top_logprobs if self.todo[0].params.top_logprobs else None

    def text_pieces(self) -> list[TextPieces]:
        stops = self.todo[0].params.stop
        holdback = max((len(s) for s in stops), default=1) - 1
        tokenizer = self.state.runner.tokenizer

        def decode(ids: list[int]) -> str:
            return str(tokenizer.decode(ids, skip_special_tokens=True))

        return [TextPieces(decode, holdback) for _ in self.todo]


async def _events(
    stream: StreamedRequest,
    opening: list[ChatCompletionChunk],
    chunk: Callable[[SequenceUpdate], BaseModel],
    usage_chunk: Callable[[Usage], BaseModel],
) -> AsyncIterator[bytes]:
    """``opening``, a chunk per update, the usage chunk if asked, then ``[DONE]``.

    The job starts with the stream, not with the handler: a response that never starts
    (the client left first) generates nothing.
    """
    scheduler = stream.state.scheduler
    job = scheduler.submit(stream.todo, stream=True)
    async with cancelled_on_disconnect(stream.request, scheduler, job):
        for model in opening:
            yield event(model)
        try:
            async for updates in job.updates():
                for update in updates:
                    yield event(chunk(update))
        except JobCancelled:
            return  # the client has left
        except Exception as error:  # the response has started: report it in the stream
            logger.exception("streamed generation failed")
            detail = {"message": f"generation failed: {error}", "type": "server_error"}
            yield event(StreamError(error=detail | {"code": 500}))
        else:
            if stream.include_usage:
                yield event(usage_chunk(usage(stream.prompt_tokens, job.sequences)))
    yield DONE


def chat_events(
    stream: StreamedRequest, calls_format: ToolCallFormat | None = None
) -> AsyncIterator[bytes]:
    """The chunks of a streamed chat completion (one prompt's ``n`` choices); with a
    ``calls_format``, each choice's calls parsed out of its text."""
    base = stream.header("chatcmpl")
    pieces = stream.text_pieces()
    replies = [StreamedCalls(calls_format) if calls_format else None for _ in stream.todo]

    def chunk(update: SequenceUpdate) -> ChatCompletionChunk:
        logprobs = None
        if stream.logprobs:
            top = stream.top_logprobs(update)
            logprobs = chat_logprobs(stream.state, update.token_ids, update.logprobs, top)
        content = pieces[update.index].push(update)
        calls: list[dict[str, Any]] = []
        reason = finish_reason(update.finish_reason)
        reply = replies[update.index]
        if reply is not None:
            content, calls = reply.push(content, finished=reason is not None)
            reason = "tool_calls" if reason is not None and reply.called else reason
        choice = ChatChunkChoice(
            index=update.index,
            delta=ChatDelta(content=content, tool_calls=calls or None),
            logprobs=logprobs,
            finish_reason=reason,
            token_ids=update.token_ids,
        )
        return ChatCompletionChunk(**base, choices=[choice])

    def usage_chunk(totals: Usage) -> ChatCompletionChunk:
        return ChatCompletionChunk(**base, choices=[], usage=totals)

    role = ChatDelta(role="assistant", content="")
    opening = [
        ChatCompletionChunk(**base, choices=[ChatChunkChoice(index=i, delta=role)])
        for i in range(len(stream.todo))
    ]
    return _events(stream, opening, chunk, usage_chunk)


def completion_events(stream: StreamedRequest) -> AsyncIterator[bytes]:
    """The chunks of a streamed completion (every prompt's ``n`` choices)."""
    base = stream.header("cmpl")
    pieces = stream.text_pieces()

    def chunk(update: SequenceUpdate) -> CompletionChunk:
        text = pieces[update.index]
        logprobs = None
        if stream.logprobs:
            top = stream.top_logprobs(update)
            logprobs = completion_logprobs(
                stream.state, update.token_ids, update.logprobs, top, text.offset
            )
            text.offset += sum(len(token) for token in logprobs.tokens)
        choice = CompletionChunkChoice(
            index=update.index,
            text=text.push(update),
            logprobs=logprobs,
            finish_reason=finish_reason(update.finish_reason),
            token_ids=update.token_ids,
        )
        return CompletionChunk(**base, choices=[choice])

    def usage_chunk(totals: Usage) -> CompletionChunk:
        return CompletionChunk(**base, choices=[], usage=totals)

    return _events(stream, [], chunk, usage_chunk)
