"""The managed-server proxy's app: ``create_app`` builds it, its routes and error answers.

An agent (any ``openai`` client, multi-turn, with tools) talks to a session's endpoint,
``{proxy}/{id}/v1/chat/completions``; every reply is sampled token-in/token-out and recorded
in the session's nodes (the exact ids the engine saw and sampled, masks, logprobs), which the
environment reads with ``GET /{id}/nodes`` to score and train on. Routes (Atropos's shape):

    POST   /sessions/create              a session, pinned to one inference server
    GET    /sessions                     open sessions
    POST   /{id}/v1/chat/completions     sample and record (tool calls parsed, Hermes format)
    POST   /{id}/v1/chat/completions/render   the prompt text and ids a request would send
    GET    /{id}/v1/models               the served model, for clients that ask
    GET    /{id}/nodes                   the recorded token-exact sequences
    DELETE /{id}                         close the session
    GET    /health, /v1/models, /servers

Who may call which (the proxy's key, the admin key, each session's own token) is
:mod:`~atroposlib.proxy.access`, checked before a body is read. The command that serves it
is :mod:`~atroposlib.proxy.cli` (``python -m atroposlib.proxy --config servers.json``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid as uuid_lib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import Field

from atroposlib.envs.server_handling.tool_call_translator import ToolCallTranslator
from atroposlib.errors import ConfigError, InferenceError, InferenceRejectedError
from atroposlib.inference.limits import BodySizeLimit
from atroposlib.proxy.access import ProxyAccess, new_session_token
from atroposlib.proxy.protocol import (
    ChatCompletionProxyRequest,
    DeletedResponse,
    ModelEntry,
    ModelListResponse,
    NodesResponse,
    OpenAIError,
    ProxyChatCompletion,
    ProxyErrorBody,
    ProxyHealth,
    RenderResponse,
    ServerInfo,
    ServerList,
    SessionCreateRequest,
    SessionCreateResponse,
    SessionInfo,
    SessionList,
)
from atroposlib.proxy.session import (
    ProxySession,
    SessionRecorder,
    TemplateRenderError,
)
from atroposlib.proxy.session_table import ServerChoiceError, SessionTable
from atroposlib.security import AccessSettings, mount_guard, warn_if_open
from atroposlib.security.gate import mount_key_first, schema_routes

__all__ = ["ProxySettings", "create_app", "openai_error"]

logger = logging.getLogger(__name__)

MiB = 1024 * 1024


class ProxySettings(AccessSettings):
    max_sessions: int = Field(default=4096, ge=1, description="Open sessions at most (429 past).")
    idle_timeout_s: float = Field(
        default=3600.0, gt=0, description="A session idle this long is closed (logged)."
    )
    max_body_bytes: int = Field(default=16 * MiB, ge=1024, description="Largest body (413).")
    default_max_tokens: int = Field(
        default=1024, ge=1, description="max_tokens of a request that sets none."
    )
    max_attempts: int = Field(default=3, ge=1, description="Tries per sample on server errors.")
    max_session_nodes: int = Field(
        default=4096, ge=1, description="Recorded sequences one session may hold (429 past)."
    )
    max_session_bytes: int = Field(
        default=256 * MiB,
        ge=1024,
        description="Bytes one session's nodes may hold (text, 8 per id, mask and logprob); "
        "a request past it: 429.",
    )
    max_sessions_per_client: int = Field(
        default=1024,
        ge=1,
        description="Open sessions one client (peer address) may hold (429 past), so no one "
        "client takes all max_sessions.",
    )
    sweep_interval_s: float = Field(
        default=60.0, gt=0, description="Seconds between sweeps closing idle sessions."
    )


def create_app(
    server_manager: Any,
    tokenizer: Any,
    model_name: str = "unknown",
    settings: ProxySettings | None = None,
) -> FastAPI:
    """The proxy app over ``server_manager``'s servers (each session pinned to one)."""
    settings = settings or ProxySettings()
    table = SessionTable(
        server_manager,
        settings.max_sessions,
        settings.idle_timeout_s,
        max_per_client=settings.max_sessions_per_client,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        sweeper = asyncio.create_task(_sweep_idle(table, settings.sweep_interval_s))
        try:
            yield
        finally:
            sweeper.cancel()

    app = FastAPI(
        title="atroposlib managed-server proxy",
        lifespan=lifespan,
        **schema_routes(settings.expose_api_docs),
    )
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _invalid_body)
    app.add_exception_handler(Exception, _unexpected)
    access = ProxyAccess(table, settings.run_keys, settings.admin_key)
    mount_key_first(app, access, _error_body)
    mount_guard(app, settings)
    warn_if_open(settings, "the managed-server proxy")
    _add_health_route(app, table, model_name)
    _add_service_routes(app, table, model_name)
    _add_listing_route(app, table)
    _add_session_routes(app, table, tokenizer, model_name, settings)
    return app


async def _sweep_idle(table: SessionTable, interval_s: float) -> None:
    """Close idle sessions every ``interval_s``, also when no new session comes to do it."""
    while True:
        await asyncio.sleep(interval_s)
        table.close_idle()


def _model_list(model_name: str) -> ModelListResponse:
    return ModelListResponse(data=[ModelEntry(id=model_name, created=int(time.time()))])


def _add_health_route(app: FastAPI, table: SessionTable, model_name: str) -> None:
    """``GET /health``: open without a key, like every server's health."""

    @app.get("/health")
    async def health() -> ProxyHealth:
        servers = table.servers
        healthy = sum(1 for s in servers if getattr(s, "server_healthy", True))
        return ProxyHealth(model=model_name, sessions=len(table), servers=len(servers),
                           healthy_servers=healthy)  # fmt: skip


def _add_service_routes(app: FastAPI, table: SessionTable, model_name: str) -> None:
    """The routes about the proxy itself: models, servers."""

    @app.get("/v1/models")
    async def models() -> ModelListResponse:
        return _model_list(model_name)

    @app.get("/servers")
    async def servers() -> ServerList:
        return ServerList(servers=[_server_info(i, s, model_name) for i, s in
                                   enumerate(table.servers)])  # fmt: skip


def _add_listing_route(app: FastAPI, table: SessionTable) -> None:
    """``GET /sessions``: every client's sessions, for the admin key (:mod:`.access`)."""

    @app.get("/sessions")
    async def list_sessions() -> SessionList:
        return SessionList(sessions=[
            SessionInfo(uuid=s.uuid, model_name=s.model_name, base_url=s.base_url,
                        created_at=s.created_at, last_accessed=s.last_accessed,
                        num_nodes=len(s.recorder.nodes))
            for s in table.sessions()
        ])  # fmt: skip


def _new_session_id() -> str:
    """A UUID of 122 random bits from the OS: unguessable, and on a proxy without a key the
    session's only capability (a keyed proxy asks for its token too)."""
    return str(uuid_lib.UUID(bytes=secrets.token_bytes(16), version=4))


def _check_room(session: ProxySession, settings: ProxySettings) -> None:
    """429 naming the limit when the session may record no more."""
    if len(session.recorder.nodes) >= settings.max_session_nodes:
        limit = settings.max_session_nodes
        raise HTTPException(429, f"session: {limit} nodes recorded (max_session_nodes); "
                            "read them and open a new session")  # fmt: skip
    if session.recorded_bytes >= settings.max_session_bytes:
        limit = settings.max_session_bytes
        raise HTTPException(429, f"session: its nodes hold {limit} bytes or more "
                            "(max_session_bytes); read them and open a new session")  # fmt: skip


def _client_of(request: Request) -> str:
    """The connection's peer: our servers run uvicorn with ``proxy_headers=False``, so an
    ``X-Forwarded-For`` header never makes one client many."""
    return request.client.host if request.client is not None else "unknown"


def _open_session(table: SessionTable, session_id: str) -> ProxySession:
    session = table.get(session_id)
    if session is None:
        raise HTTPException(404, f"session: no open session {session_id[:80]!r}")
    session.touch()
    return session


def _add_session_routes(
    app: FastAPI, table: SessionTable, tokenizer: Any, model_name: str, settings: ProxySettings
) -> None:
    """Creating a session and everything under ``/{session_id}`` (whose token the gate,
    :class:`ProxyAccess`, has checked before the route runs)."""
    _add_create_route(app, table, tokenizer, model_name, settings)

    @app.post("/{session_id}/v1/chat/completions")
    async def chat_completions(
        session_id: str, body: ChatCompletionProxyRequest
    ) -> ProxyChatCompletion:
        session = _open_session(table, session_id)
        _check_room(session, settings)
        try:
            choices = await session.complete(body, settings.default_max_tokens)
        except TemplateRenderError as exc:
            raise HTTPException(400, str(exc)) from exc
        except InferenceRejectedError as exc:
            raise HTTPException(400, f"messages: the inference server refused the request "
                                f"(too long for its context?): {exc}") from exc  # fmt: skip
        except InferenceError as exc:
            raise HTTPException(502, f"inference failed; the session's nodes are unchanged, "
                                f"retry the request: {exc}") from exc  # fmt: skip
        return ProxyChatCompletion(id=f"chatcmpl-{uuid_lib.uuid4().hex[:24]}",
                                   created=int(time.time()), model=model_name,
                                   choices=choices)  # fmt: skip

    @app.post("/{session_id}/v1/chat/completions/render")
    async def render(session_id: str, body: ChatCompletionProxyRequest) -> RenderResponse:
        session = _open_session(table, session_id)
        try:
            prompt, ids = session.render(body)
        except TemplateRenderError as exc:
            raise HTTPException(400, str(exc)) from exc
        return RenderResponse(prompt_text=prompt, token_ids=ids, num_tokens=len(ids))

    @app.get("/{session_id}/v1/models")
    async def session_models(session_id: str) -> ModelListResponse:
        _open_session(table, session_id)
        return _model_list(model_name)

    @app.get("/{session_id}/nodes")
    async def nodes(session_id: str) -> NodesResponse:
        return NodesResponse(nodes=_open_session(table, session_id).nodes)

    @app.delete("/{session_id}")
    async def delete_session(session_id: str) -> DeletedResponse:
        session = table.pop(session_id)
        if session is None:
            raise HTTPException(404, f"session: no open session {session_id[:80]!r}")
        return DeletedResponse(uuid=session.uuid)


def _add_create_route(
    app: FastAPI, table: SessionTable, tokenizer: Any, model_name: str, settings: ProxySettings
) -> None:
    """``POST /sessions/create``: a session on a chosen server, with its own token."""

    @app.post("/sessions/create")
    async def create_session(body: SessionCreateRequest, request: Request) -> SessionCreateResponse:
        try:
            ToolCallTranslator(tokenizer, body.tool_parser)
        except ConfigError as exc:
            raise HTTPException(400, f"tool_parser: {exc}") from exc
        if body.track_tree:
            raise HTTPException(400, "track_tree: tree mode is not provided; each session "
                                "tracks its nodes as a list (send false)")  # fmt: skip
        try:
            server = table.pick_server(body.base_url)
        except ServerChoiceError as exc:
            raise HTTPException(exc.status_code, str(exc)) from exc
        # a session that named its server stays there; the others move only if theirs fails
        spare = table.spare_for if body.base_url is None else None
        recorder = SessionRecorder(
            server, tokenizer, body.tool_parser, settings.max_attempts, spare=spare
        )
        session = ProxySession(
            uuid=_new_session_id(), recorder=recorder, model_name=model_name,
            tool_parser=body.tool_parser, base_url=table.base_url_of(server),
            temperature=body.temperature, client=_client_of(request), token=new_session_token(),
        )  # fmt: skip
        refused = table.limit_reached(session.client)
        if refused is not None:
            limit = getattr(settings, refused)
            whose = "are open" if refused == "max_sessions" else "are open for this client"
            raise HTTPException(429, f"sessions: {limit} {whose} ({refused}); close finished "
                                "ones with DELETE /{id}")  # fmt: skip
        table.add(session)  # room was checked just now, with nothing awaited since
        return SessionCreateResponse(uuid=session.uuid, model_name=model_name,
                                     tool_parser=session.tool_parser, base_url=session.base_url,
                                     created_at=session.created_at,
                                     session_token=session.token)  # fmt: skip


def _server_info(index: int, server: Any, model_name: str) -> ServerInfo:
    config = getattr(server, "config", None)
    return ServerInfo(
        index=index,
        base_url=getattr(config, "base_url", None),
        healthy=bool(getattr(server, "server_healthy", True)),
        model_name=str(getattr(config, "model_name", model_name)),
        server_type=str(getattr(config, "server_type", "unknown")),
        token_ids=getattr(server, "supports_token_ids", True) is not False,
    )


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                413: "invalid_request_error", 429: "rate_limit_error"}  # fmt: skip


def openai_error(
    status_code: int, message: str, error_type: str | None = None, param: str | None = None
) -> Response:
    """An error answer: ``detail`` and OpenAI's ``error`` object (Atropos's name)."""
    body = _error_body(status_code, message, error_type, param)
    return Response(body, status_code, media_type="application/json")


def _error_body(
    status_code: int, message: str, error_type: str | None = None, param: str | None = None
) -> bytes:
    default = "server_error" if status_code >= 500 else "invalid_request_error"
    kind = error_type or _ERROR_TYPES.get(status_code, default)
    error = OpenAIError(message=message, type=kind, code=status_code, param=param)
    return ProxyErrorBody(detail=message, error=error).model_dump_json().encode()


async def _http_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return openai_error(exc.status_code, str(exc.detail))


async def _invalid_body(_: Request, exc: Exception) -> Response:
    """400 (OpenAI's status for a bad request) naming each field; the input is left out."""
    assert isinstance(exc, RequestValidationError)
    problems: dict[str, str] = {}
    for error in exc.errors():
        if error.get("type") == "json_invalid":
            problems.setdefault("body", f"not valid JSON ({error.get('msg')})")
            continue
        problems.setdefault(_field_path(error.get("loc", ())), str(error.get("msg")))
    ordered = sorted(problems.items(), key=lambda item: (item[0].count("."), item[0]))
    detail = "; ".join(f"{path}: {message}" for path, message in ordered[:5])
    return openai_error(400, detail, param=ordered[0][0] if ordered else None)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def _field_path(loc: Any) -> str:
    """``messages.0.content`` from pydantic's location, without union-member tags."""
    parts = [
        str(part) for part in loc
        if part != "body" and not (isinstance(part, str) and ("[" in part or part in _TYPE_TAGS))
    ]  # fmt: skip
    return ".".join(parts) or "body"


async def _unexpected(request: Request, exc: Exception) -> Response:
    logger.exception("proxy: %s %s failed", request.method, request.url.path, exc_info=exc)
    return openai_error(500, f"the proxy failed: {type(exc).__name__}: {exc}")
