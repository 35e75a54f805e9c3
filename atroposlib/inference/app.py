"""``create_app(settings)``: the embedded inference server as a FastAPI app.

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (OpenAI shapes), ``POST /generate`` (SGLang's token-in,
token-out shape) and ``POST /update_weights_from_disk`` (SGLang's reload shape).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import torch
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from atroposlib.inference.engine import ModelRunner, check_compatible, load_model
from atroposlib.inference.openai_api import router as openai_router
from atroposlib.inference.scheduler import Scheduler
from atroposlib.inference.settings import InferenceSettings
from atroposlib.inference.state import ServerState, server_state
from atroposlib.inference.token_api import router as token_router
from atroposlib.protocol import InferenceHealthResponse, UpdateWeightsRequest, UpdateWeightsResponse

logger = logging.getLogger(__name__)


def create_app(settings: InferenceSettings) -> FastAPI:
    """Build the app; the model is loaded and the worker started by the lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.threads is not None:
            torch.set_num_threads(settings.threads)
        runner = await asyncio.to_thread(
            ModelRunner, settings.model, settings.device, settings.dtype
        )
        scheduler = Scheduler(runner, max_batch_size=settings.max_batch_size)
        scheduler.start()
        app.state.inference = ServerState(settings, runner, scheduler, started=int(time.time()))
        logger.info("serving %s as %r on %s", settings.model, settings.model_name, runner.device)
        try:
            yield
        finally:
            await asyncio.to_thread(scheduler.stop)

    app = FastAPI(title="atroposlib inference", lifespan=lifespan)
    guarded = [Depends(_bearer_check(settings.api_key))]
    app.include_router(openai_router, dependencies=guarded)
    app.include_router(token_router, dependencies=guarded)
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route(
        "/update_weights_from_disk",
        update_weights_from_disk,
        methods=["POST"],
        dependencies=guarded,
        response_model=UpdateWeightsResponse,
    )
    return app


async def health(request: Request) -> InferenceHealthResponse:
    state = server_state(request)
    return InferenceHealthResponse(
        model=state.settings.model_name, weight_version=state.scheduler.weight_version
    )


async def update_weights_from_disk(body: UpdateWeightsRequest, request: Request) -> Any:
    """Load a checkpoint beside the served weights, then swap it in between steps."""
    state = server_state(request)
    async with state.swap_lock:
        runner = state.runner
        try:
            model = await asyncio.to_thread(
                load_model, body.model_path, runner.device, runner.dtype
            )
            check_compatible(runner.model, model)
        except (OSError, ValueError, KeyError, RuntimeError) as error:
            logger.warning("update_weights_from_disk(%s) refused: %s", body.model_path, error)
            message = f"model_path: {error}"
            answer = UpdateWeightsResponse(
                success=False, message=message, weight_version=state.scheduler.weight_version
            )
            return JSONResponse(status_code=400, content=answer.model_dump() | {"detail": message})
        started = time.perf_counter()
        version = await state.scheduler.swap_weights(model)
    return UpdateWeightsResponse(
        success=True,
        message=f"loaded {body.model_path} (waited {time.perf_counter() - started:.2f} s "
        "for in-flight requests)",
        weight_version=version,
    )


def _bearer_check(api_key: str | None) -> Any:
    async def check(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise HTTPException(
                status_code=401,
                detail="authorization: send the header `Authorization: Bearer <api key>`",
            )

    return check
