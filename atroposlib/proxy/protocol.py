"""The managed-server proxy's wire contract: every body its app and its client exchange.

The chat request is OpenAI's, as an agent's ``openai`` client sends it (unknown keys are
ignored, as OpenAI-compatible servers do); everything else follows Atropos's proxy
(``POST /sessions/create``, ``GET /{id}/nodes``, ...). Errors carry ``detail`` (the field and
the fix) and OpenAI's ``error`` object, so both our clients and OpenAI SDKs read them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from atroposlib.bounds import INT32_MAX
from atroposlib.envs.server_handling.managed import SequenceNode

MAX_ID_CHARS = 256
MAX_NAME_CHARS = 256
MAX_STOP_STRINGS = 16
MAX_CHOICES = 64

ChatRole = Literal["system", "developer", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "tool_calls", "content_filter"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ToolFunction(_Body):
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    arguments: str | dict[str, Any] = Field(
        default="{}", description="JSON text, as the model wrote it (it may not parse)."
    )


class ToolCall(_Body):
    id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    type: Literal["function"] = "function"
    function: ToolFunction


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    """One message of the conversation; content parts must be text."""

    role: ChatRole
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    name: str | None = Field(default=None, max_length=MAX_NAME_CHARS)

    def as_template_dict(self) -> dict[str, Any]:
        """The message as a chat template reads it: content as one string."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        out: dict[str, Any] = {"role": self.role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        for key in ("tool_call_id", "name"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)


class ToolSpec(BaseModel):
    """A tool the model may call (OpenAI's shape); passed to the chat template as sent."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: FunctionSpec


class NamedToolChoice(_Body):
    type: Literal["function"] = "function"
    function: FunctionSpec


class ChatCompletionProxyRequest(_Body):
    """``POST /{id}/v1/chat/completions`` (and ``.../render``, which samples nothing)."""

    messages: list[ChatMessage] = Field(min_length=1)
    model: str | None = Field(default=None, description="Ignored: the proxy serves one model.")
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float = Field(default=1.0, ge=0.0, le=100.0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    stream: bool = False

    @field_validator("stream")
    @classmethod
    def _no_streaming(cls, value: bool) -> bool:
        if value:
            raise ValueError("streaming is not supported by the proxy; send stream: false")
        return value

    def template_messages(self) -> list[dict[str, Any]]:
        return [message.as_template_dict() for message in self.messages]

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [tool.model_dump() for tool in self.tools] if self.tools else None

    def sampling(self, temperature: float | None, default_max_tokens: int) -> dict[str, Any]:
        """Engine sampling kwargs; ``temperature`` (the session's) wins over the request's."""
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        max_tokens = self.max_completion_tokens or self.max_tokens or default_max_tokens
        params = {
            "max_tokens": max_tokens,
            "temperature": self.temperature if temperature is None else temperature,
            "top_p": self.top_p,
            "stop": stop or None,
            "seed": self.seed,
        }
        return {key: value for key, value in params.items() if value is not None}


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ProxyChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason


class ProxyChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ProxyChoice]


class RenderResponse(BaseModel):
    """The prompt a chat request would send: its text and the exact ids (a tracked node's
    recorded ids, then the new text tokenized)."""

    prompt_text: str
    token_ids: list[int]
    num_tokens: int


class SessionCreateRequest(_Body):
    tool_parser: str = Field(default="hermes", max_length=MAX_NAME_CHARS)
    track_tree: bool = Field(default=False, description="Atropos's tree mode (not provided).")
    base_url: str | None = Field(
        default=None, max_length=2048, description="Pin the session to this inference server."
    )
    temperature: float | None = Field(
        default=None,
        ge=0.0,
        le=100.0,
        allow_inf_nan=False,
        description="Our extension: every request samples at this temperature, whatever the "
        "agent asks, so the trainer knows the temperature of every sampled token.",
    )


class SessionCreateResponse(BaseModel):
    uuid: str
    model_name: str
    tool_parser: str
    base_url: str | None = None
    created_at: float
    session_token: str | None = Field(
        default=None,
        description="The session's own key: its routes (/{uuid}/...) on a keyed proxy need "
        "'Authorization: Bearer <session_token>' (the agent's OpenAI api_key). Told only here.",
    )


class SessionInfo(BaseModel):
    uuid: str
    model_name: str
    base_url: str | None
    created_at: float
    last_accessed: float
    num_nodes: int


class SessionList(BaseModel):
    sessions: list[SessionInfo]


class NodesResponse(BaseModel):
    nodes: list[SequenceNode]


class DeletedResponse(BaseModel):
    status: Literal["deleted"] = "deleted"
    uuid: str


class ProxyHealth(BaseModel):
    status: Literal["ok"] = "ok"
    model: str
    sessions: int
    servers: int
    healthy_servers: int


class ServerInfo(BaseModel):
    index: int
    base_url: str | None
    healthy: bool
    model_name: str
    server_type: str
    token_ids: bool


class ServerList(BaseModel):
    servers: list[ServerInfo]


class ModelEntry(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "atroposlib"


class ModelListResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelEntry]


class OpenAIError(BaseModel):
    message: str
    type: str
    code: int
    param: str | None = None


class ProxyErrorBody(BaseModel):
    """Every 4xx/5xx: ``detail`` for us, ``error`` for OpenAI SDKs (same message)."""

    detail: str
    error: OpenAIError
