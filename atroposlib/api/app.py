"""The broker's HTTP face: ``create_app(settings)`` builds a FastAPI app around a :class:`Broker`.

Routes translate HTTP only. The hot paths (``/scored_data``, ``/scored_data_list``, ``/batch``)
read raw bodies, decode them with :mod:`atroposlib.codec` (JSON or msgpack) and answer orjson /
msgpack bytes; no pydantic on token lists. All state lives in the lifespan.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.routing import Route

from atroposlib import codec
from atroposlib.api.broker import Broker
from atroposlib.api.compression import GzipAnswers
from atroposlib.api.http import bearer_ok, encoded, read_body, read_model
from atroposlib.api.metrics import BrokerMetrics
from atroposlib.api.settings import BrokerSettings
from atroposlib.api.store import GroupStore, open_store
from atroposlib.errors import (
    InvalidGroupError,
    QueueFullError,
    RequestBodyError,
    TrainerNotRegisteredError,
    UnknownEnvError,
)
from atroposlib.protocol import (
    Acknowledgement,
    AcknowledgementResponse,
    EnvRef,
    EnvRegistration,
    HealthResponse,
    ScoredDataListResponse,
    ScoredDataResponse,
    SuccessResponse,
    TrainerRegistration,
    TrainerRegistrationResponse,
)

logger = logging.getLogger(__name__)


class _Runtime:
    """What the lifespan owns: the broker while the app runs."""

    broker: Broker | None = None

    def get(self) -> Broker:
        if self.broker is None:
            raise RuntimeError("broker app used outside its lifespan; start it with a server")
        return self.broker


def _error_handlers() -> dict[
    int | type[Exception], Callable[[Request, Any], Coroutine[Any, Any, Response]]
]:
    async def invalid_group(_: Request, err: InvalidGroupError) -> Response:
        return JSONResponse({"detail": str(err)}, status_code=422)

    async def unknown_env(_: Request, err: UnknownEnvError) -> Response:
        return JSONResponse({"detail": str(err)}, status_code=404)

    async def not_registered(_: Request, err: TrainerNotRegisteredError) -> Response:
        return JSONResponse({"detail": str(err)}, status_code=409)

    async def queue_full(_: Request, err: QueueFullError) -> Response:
        headers = {"Retry-After": str(err.retry_after)}
        return JSONResponse({"detail": str(err)}, status_code=503, headers=headers)

    async def bad_body(_: Request, err: RequestBodyError) -> Response:
        return JSONResponse({"detail": err.message}, status_code=err.status_code)

    return {
        InvalidGroupError: invalid_group,
        UnknownEnvError: unknown_env,
        TrainerNotRegisteredError: not_registered,
        QueueFullError: queue_full,
        RequestBodyError: bad_body,
    }


def create_app(
    settings: BrokerSettings | None = None, *, store: GroupStore | None = None
) -> FastAPI:
    """A broker app; it opens ``settings.store`` (or uses ``store``) when its lifespan starts."""
    settings = settings or BrokerSettings()
    runtime = _Runtime()
    metrics = BrokerMetrics(lambda: runtime.broker)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        own_store = store is None
        active = store if store is not None else open_store(settings.store)
        runtime.broker = Broker(active, settings)
        try:
            yield
        finally:
            runtime.broker = None
            if own_store:
                active.close()

    async def authorize(request: Request) -> None:
        if settings.api_key is not None and not bearer_ok(request, settings.api_key):
            raise _UnauthorizedError

    public_docs = settings.api_key is None
    app = FastAPI(
        title="atroposlib broker",
        openapi_url="/openapi.json" if public_docs else None,
        lifespan=lifespan,
        dependencies=[Depends(authorize)] if settings.api_key is not None else [],
        exception_handlers=_error_handlers(),
    )
    app.add_exception_handler(_UnauthorizedError, _unauthorized)
    app.add_middleware(GzipAnswers, minimum_size=1000, gzip_level=settings.gzip_level)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
        )

    def broker() -> Broker:
        return runtime.get()

    @app.get("/")
    async def root() -> dict[str, str]:
        return {"message": "AtroposLib API"}

    @app.get("/health")
    async def health() -> HealthResponse:
        active = broker()
        return HealthResponse(store=active.store.description, queue_size=active.status().queue_size)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # -- trainer -------------------------------------------------------------------------

    @app.post("/register")
    async def register(request: Request) -> TrainerRegistrationResponse:
        registration = await read_model(request, settings, TrainerRegistration)
        return TrainerRegistrationResponse(uuid=broker().register_trainer(registration))

    async def batch(request: Request) -> Response:
        started = time.perf_counter()
        formed = broker().next_batch()
        metrics.batch_seconds.observe(time.perf_counter() - started)
        if formed is None:
            return encoded(request, {"batch": None, "step": None})
        step, groups = formed
        if codec.is_msgpack(request.headers.get("accept")):
            groups = [codec.pack_group(group) for group in groups]
        response = encoded(request, {"batch": groups, "step": step})
        metrics.bytes_out.inc(len(response.body))
        return response

    @app.post("/ack")
    async def ack(request: Request) -> AcknowledgementResponse:
        acknowledgement = await read_model(request, settings, Acknowledgement)
        return AcknowledgementResponse(acknowledged_step=broker().ack(acknowledgement.step))

    @app.get("/info")
    async def info() -> dict[str, int]:
        return broker().info().model_dump()

    @app.get("/wandb_info")
    async def wandb_info() -> dict[str, str | None]:
        return broker().wandb_info().model_dump()

    @app.get("/status")
    async def status() -> dict[str, int]:
        return broker().status().model_dump()

    # -- environments --------------------------------------------------------------------

    @app.post("/register-env")
    async def register_env(request: Request) -> dict[str, Any]:
        registration = await read_model(request, settings, EnvRegistration)
        return broker().register_env(registration).model_dump()

    @app.post("/disconnect-env")
    async def disconnect_env(request: Request) -> SuccessResponse:
        env = await read_model(request, settings, EnvRef)
        broker().disconnect_env(env.env_id)
        return SuccessResponse()

    @app.get("/status-env")
    async def status_env(request: Request, env_id: int | None = None) -> dict[str, Any]:
        if env_id is None:
            env_id = (await read_model(request, settings, EnvRef)).env_id
        return broker().status_env(env_id).model_dump()

    async def scored_data(request: Request) -> Response:
        body = await read_body(request, settings)
        metrics.bytes_in.inc(len(body))
        raw = codec.decode(body, request.headers.get("content-type"))
        result = broker().ingest([raw])
        return encoded(request, ScoredDataResponse(duplicate=result.duplicates > 0).model_dump())

    async def scored_data_list(request: Request) -> Response:
        body = await read_body(request, settings)
        metrics.bytes_in.inc(len(body))
        raws = codec.decode(body, request.headers.get("content-type"))
        if not isinstance(raws, list):
            raise InvalidGroupError("body", "must be a JSON array of groups")
        result = broker().ingest(raws, as_list=True)
        answer = ScoredDataListResponse(groups_processed=len(raws), duplicates=result.duplicates)
        return encoded(request, answer.model_dump())

    # -- views and maintenance -----------------------------------------------------------

    @app.get("/latest_example")
    async def latest_example(request: Request) -> Response:
        return encoded(request, broker().latest_example())

    @app.get("/recent_groups")
    async def recent_groups(
        request: Request, limit: int = 16, env_id: int | None = None
    ) -> Response:
        groups = broker().recent_groups(limit, env_id)
        if codec.is_msgpack(request.headers.get("accept")):
            groups = [codec.pack_group(group) for group in groups]
        return encoded(request, {"groups": groups})

    @app.get("/reset_data")
    async def reset_data() -> PlainTextResponse:
        broker().reset()
        return PlainTextResponse("Reset successful")

    _add_hot_routes(
        app,
        settings,
        [("/batch", "GET", batch), ("/scored_data", "POST", scored_data),
         ("/scored_data_list", "POST", scored_data_list)],
    )  # fmt: skip
    return app


def _add_hot_routes(
    app: FastAPI,
    settings: BrokerSettings,
    routes: list[tuple[str, str, Callable[[Request], Coroutine[Any, Any, Response]]]],
) -> None:
    """The per-group routes as plain Starlette routes, matched first.

    They take only the request and answer bytes, so FastAPI's dependency solving and the
    walk past the other routes are pure overhead on them (measured in
    benchmarks/broker_request_overhead.py). They stay in the OpenAPI schema as API routes.
    """
    api_key = settings.api_key
    hot: list[Route] = []
    for path, method, handler in routes:
        app.add_api_route(path, handler, methods=[method], response_class=Response)
        if api_key is not None:
            handler = _with_auth(handler, api_key)
        hot.append(Route(path, handler, methods=[method], include_in_schema=False))
    app.router.routes[:0] = hot


def _with_auth(
    handler: Callable[[Request], Coroutine[Any, Any, Response]], api_key: str
) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    async def checked(request: Request) -> Response:
        if not bearer_ok(request, api_key):
            raise _UnauthorizedError
        return await handler(request)

    return checked


class _UnauthorizedError(Exception):
    pass


async def _unauthorized(_: Request, __: Exception) -> Response:
    return JSONResponse(
        {"detail": "missing or wrong bearer token; send 'Authorization: Bearer <api_key>'"},
        status_code=401,
        headers={"WWW-Authenticate": "Bearer"},
    )
