"""The broker's HTTP face: ``create_app(settings)`` builds a FastAPI app around a :class:`Broker`.

Routes translate HTTP only. The per-group routes (``/scored_data``, ``/scored_data_list``,
``/batch``) live in :mod:`atroposlib.api.hot`: raw bodies in, orjson / msgpack bytes out, no
pydantic on token lists, served straight from ASGI. All state lives in the lifespan.

Keys: every route takes the run key (``--api-key``) or the admin key (``--admin-api-key``);
the trainer's routes (``/register``, ``/batch``, ``/ack``, ``/reset_data``) take the admin key
only when one is set. Without any key (loopback) everything is open, as in Atropos.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import Receive, Scope, Send

from atroposlib import codec
from atroposlib.api.broker import Broker
from atroposlib.api.compression import GzipAnswers
from atroposlib.api.hot import (
    BROKER_ERRORS,
    Answer,
    Handler,
    HotRoutes,
    error_answer,
)
from atroposlib.api.http import (
    encoded,
    read_body,
    read_model,
)
from atroposlib.api.metrics import BrokerMetrics
from atroposlib.api.openapi import (
    ERRORS,
    LATEST_EXAMPLE,
    install_body_schemas,
    request_body,
)
from atroposlib.api.settings import BrokerSettings
from atroposlib.api.store import GroupStore, open_store
from atroposlib.bounds import INT32_MAX, MAX_STEP
from atroposlib.security import ADMIN_DETAIL, mount_guard, require_bearer, warn_if_open
from atroposlib.security.gate import RouteKeys, mount_key_first, schema_routes
from atroposlib.web import validation_answer
from atroposlib.wire.broker import (
    Acknowledgement,
    AcknowledgementResponse,
    EnvRef,
    EnvRegistration,
    EnvRegistrationResponse,
    EnvStatusResponse,
    HealthResponse,
    InfoResponse,
    RecentGroupsResponse,
    RootResponse,
    StatusResponse,
    SuccessResponse,
    TrainerRegistration,
    TrainerRegistrationResponse,
    WaitForTrainerResponse,
    WandbInfoResponse,
)

logger = logging.getLogger(__name__)

EnvIdQuery = Annotated[int | None, Query(ge=-MAX_STEP, le=MAX_STEP)]


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
    async def broker_error(_: Request, err: Exception) -> Response:
        answer = error_answer(err)
        assert answer is not None, f"no HTTP answer for {type(err).__name__}"
        return _response(answer)

    async def invalid_request(_: Request, err: RequestValidationError) -> Response:
        return validation_answer(err)

    handlers: dict[int | type[Exception], Any] = dict.fromkeys(BROKER_ERRORS, broker_error)
    handlers[RequestValidationError] = invalid_request
    return handlers


def _response(answer: Answer) -> Response:
    return Response(
        answer.body, status_code=answer.status, media_type=answer.media_type,
        headers=answer.headers,
    )  # fmt: skip


class BrokerApp(FastAPI):
    """FastAPI, except that the per-group routes are served by :class:`HotRoutes` directly."""

    hot_routes: HotRoutes | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot = self.hot_routes
        if hot is not None and scope["type"] == "http":
            route = hot.routes.get((scope["method"], scope["path"]))
            if route is not None:
                await hot.serve(route, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(
    settings: BrokerSettings | None = None, *, store: GroupStore | None = None
) -> BrokerApp:
    """A broker app; it opens ``settings.store`` (or uses ``store``) when its lifespan starts."""
    settings = settings or BrokerSettings()
    runtime = _Runtime()
    metrics = BrokerMetrics(lambda: runtime.broker)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        own_store = store is None
        if store is None:
            active = open_store(
                settings.store, sync_interval=settings.sync_interval,
                min_free_bytes=settings.min_free_bytes, segment_bytes=settings.segment_bytes,
            )  # fmt: skip
        else:
            active = store
        runtime.broker = Broker(active, settings)
        try:
            yield
        finally:
            runtime.broker = None
            if own_store:
                active.close()

    app = BrokerApp(
        title="atroposlib broker",
        **schema_routes(settings.expose_api_docs),
        lifespan=lifespan,
        dependencies=[Depends(require_bearer(settings.run_keys))],
        exception_handlers=_error_handlers(),
    )
    hot = HotRoutes(runtime.get, settings, metrics)
    app.add_middleware(GzipAnswers, minimum_size=1000, gzip_level=settings.gzip_level)
    mount_key_first(app, RouteKeys(settings.run_keys))  # the schema routes have no dependencies
    mount_guard(app, settings, hot.guard)
    warn_if_open(settings, "the broker")

    _service_routes(app, runtime.get, metrics)
    _trainer_routes(app, runtime.get, settings)
    _env_routes(app, runtime.get, settings)
    _view_routes(app, runtime.get, settings)
    _hot_routes(app, hot, settings)
    install_body_schemas(app)
    if not settings.cors_origins:
        app.hot_routes = hot  # CORS headers need the middleware stack
    return app


BrokerRef = Callable[[], Broker]


def _service_routes(app: FastAPI, broker: BrokerRef, metrics: BrokerMetrics) -> None:
    @app.get("/", responses=ERRORS)
    async def root() -> RootResponse:
        return RootResponse(message="AtroposLib API")

    @app.get("/health", responses=ERRORS)
    async def health() -> HealthResponse:
        active = broker()
        return HealthResponse(store=active.store.description, queue_size=active.status().queue_size)

    @app.get("/metrics", response_class=PlainTextResponse, responses=ERRORS)
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _admin(settings: BrokerSettings) -> list[Any]:
    """The dependency of the trainer's routes (registering, batches, acks, resetting the
    queue): the admin key, else the run key. Environments hold the run key only, so none of
    them can take the trainer's batches, drop its retained ones or change its registration."""
    return [Depends(require_bearer(settings.admin_key, ADMIN_DETAIL))]


def _trainer_routes(app: FastAPI, broker: BrokerRef, settings: BrokerSettings) -> None:
    @app.post(
        "/register", responses=ERRORS, dependencies=_admin(settings),
        openapi_extra=request_body(TrainerRegistration, "The trainer announces itself."),
    )  # fmt: skip
    async def register(request: Request) -> TrainerRegistrationResponse:
        registration = await read_model(request, settings, TrainerRegistration)
        return TrainerRegistrationResponse(uuid=broker().register_trainer(registration))

    @app.post(
        "/ack", responses=ERRORS, dependencies=_admin(settings),
        openapi_extra=request_body(Acknowledgement, "Batches up to this step are trained."),
    )  # fmt: skip
    async def ack(request: Request) -> AcknowledgementResponse:
        acknowledgement = await read_model(request, settings, Acknowledgement)
        return AcknowledgementResponse(acknowledged_step=broker().ack(acknowledgement.step))

    @app.get("/info", responses=ERRORS)
    async def info() -> InfoResponse:
        return broker().info()

    @app.get("/wandb_info", responses=ERRORS)
    async def wandb_info() -> WandbInfoResponse:
        return broker().wandb_info()

    @app.get("/status", responses=ERRORS)
    async def status() -> StatusResponse:
        return broker().status()


def _env_routes(app: FastAPI, broker: BrokerRef, settings: BrokerSettings) -> None:
    @app.post(
        "/register-env", responses=ERRORS,
        openapi_extra=request_body(EnvRegistration, "An environment announces itself."),
    )  # fmt: skip
    async def register_env(
        request: Request,
    ) -> EnvRegistrationResponse | WaitForTrainerResponse:
        registration = await read_model(request, settings, EnvRegistration)
        return broker().register_env(registration)

    @app.post(
        "/disconnect-env", responses=ERRORS,
        openapi_extra=request_body(EnvRef, "The env that stops."),
    )  # fmt: skip
    async def disconnect_env(request: Request) -> SuccessResponse:
        env = await read_model(request, settings, EnvRef)
        broker().disconnect_env(env.env_id)
        return SuccessResponse()

    @app.get("/status-env", responses=ERRORS)
    async def status_env(request: Request, env_id: EnvIdQuery = None) -> EnvStatusResponse:
        """The env id as a query parameter, or (as Atropos's clients send it) a JSON body."""
        if env_id is None:
            env_id = (await read_model(request, settings, EnvRef)).env_id
        return broker().status_env(env_id)


def _view_routes(app: FastAPI, broker: BrokerRef, settings: BrokerSettings) -> None:
    @app.get("/latest_example", responses={200: LATEST_EXAMPLE, **ERRORS})
    async def latest_example(request: Request) -> Response:
        return encoded(request, broker().latest_example())

    @app.get("/recent_groups", responses={200: {"model": RecentGroupsResponse}, **ERRORS})
    async def recent_groups(
        request: Request,
        limit: Annotated[int, Query(ge=0, le=INT32_MAX)] = 16,
        env_id: EnvIdQuery = None,
    ) -> Response:
        groups = broker().recent_groups(limit, env_id)
        if codec.is_msgpack(request.headers.get("accept")):
            groups = [codec.pack_group(group) for group in groups]
        return encoded(request, {"groups": groups})

    @app.get(
        "/reset_data", response_class=PlainTextResponse, responses=ERRORS,
        dependencies=_admin(settings),
    )  # fmt: skip
    async def reset_data() -> PlainTextResponse:
        broker().reset()
        return PlainTextResponse("Reset successful")


def _hot_routes(app: FastAPI, hot: HotRoutes, settings: BrokerSettings) -> None:
    """The hot routes as ordinary FastAPI routes too (OpenAPI schema; CORS setups)."""
    for route in hot.declared:
        app.add_api_route(
            route.path, _route(route.handler, settings), methods=[route.method],
            response_class=Response, openapi_extra=route.openapi_extra,
            dependencies=_admin(settings) if route.admin else None,
            responses={200: {"model": route.response_model}, **ERRORS},
        )  # fmt: skip


def _route(
    handler: Handler, settings: BrokerSettings
) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    async def route(request: Request) -> Response:
        body = await read_body(request, settings) if request.method == "POST" else b""
        return _response(await handler(request.headers, body, request.url.query))

    return route
