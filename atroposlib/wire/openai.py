"""The inference server's OpenAI-compatible models: completions, chat, streaming, models.

The embedded server answers these shapes, and so do vLLM and SGLang; our extensions (output
``token_ids``, ``prompt_token_ids``, vLLM's sampling extras) are optional fields.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from atroposlib.bounds import INT32_MAX, Name
from atroposlib.wire.common import STOP_LIST_MAX, Body, Seed, Stop, TokenId

ChatRole = Literal["system", "developer", "user", "assistant", "tool"]
OpenAIFinishReason = Literal["stop", "length", "abort", "tool_calls"]
"""``abort``: cut off by a pause in ``abort`` mode (vLLM's name); the tokens so far are kept."""


class StreamOptions(Body):
    include_usage: bool = Field(default=False, description="Send a last chunk with usage.")


class OpenAISamplingFields(Body):
    """Settings shared by the OpenAI-style requests."""

    model: Name = Field(description="A served model name (see GET /v1/models).")
    n: int = Field(default=1, ge=1, le=128, description="Choices to generate per prompt.")
    temperature: float = Field(default=1.0, ge=0.0, allow_inf_nan=False, description="0: greedy")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(default=-1, ge=-1, le=INT32_MAX, description="vLLM extension; -1 or 0: off.")
    min_p: float = Field(
        default=0.0, ge=0.0, le=1.0, allow_inf_nan=False, description="vLLM extension; 0: off."
    )
    stop: Stop | None = None
    seed: Seed | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop_token_ids: list[TokenId] | None = Field(
        default=None, max_length=STOP_LIST_MAX, description="vLLM extension."
    )
    ignore_eos: bool = Field(default=False, description="vLLM extension: run to max_tokens.")


class CompletionRequest(OpenAISamplingFields):
    """``POST /v1/completions``; ``prompt`` may be text or token ids, one or a list."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1, le=INT32_MAX)
    logprobs: int | None = Field(default=None, ge=0, le=20, description="Top logprobs per token.")
    echo: bool = False


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: ChatRole
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(OpenAISamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = Field(
        default=None, description="OpenAI tool specs, rendered by the chat template."
    )
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = Field(
        default=None, description='"none": replies are never parsed for tool calls.'
    )


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: OpenAIFinishReason
    token_ids: list[int] | None = Field(default=None, description="Our extension: output ids.")


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict[str, Any]] = Field(
        default_factory=list,
        description="OpenAI-shaped calls parsed from the reply (server's tool_call_parser).",
    )


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChoiceLogprobs | None = None
    finish_reason: OpenAIFinishReason
    token_ids: list[int] | None = Field(default=None, description="Our extension: output ids.")


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = Field(default=None, description="Our extension.")


class ChatDelta(BaseModel):
    """What a chunk adds to a choice's message; absent keys are left out, as OpenAI does."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = Field(
        default=None, description="Whole calls, each with its ``index`` in the reply's calls."
    )

    @model_serializer(mode="wrap")
    def _without_nulls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: OpenAIFinishReason | None = None
    token_ids: list[int] | None = Field(default=None, description="Our extension: new ids.")


class ChatCompletionChunk(BaseModel):
    """One ``data:`` event of a streamed chat completion (``stream: true``)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChunkChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: OpenAIFinishReason | None = None
    token_ids: list[int] | None = Field(default=None, description="Our extension: new ids.")


class CompletionChunk(BaseModel):
    """One ``data:`` event of a streamed completion (``stream: true``)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None


class StreamError(BaseModel):
    """The last ``data:`` event of a stream that failed after it started."""

    error: dict[str, Any]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "atroposlib"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
