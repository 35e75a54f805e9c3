"""``create_app(settings)``: the embedded inference server as a FastAPI app.

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (OpenAI shapes), ``POST /generate`` (SGLang's token-in,
token-out shape), ``POST /tokenize`` (the served tokenizer's ids, vLLM's and SGLang's shape),
``POST /update_weights_from_disk`` (SGLang's reload shape),
``POST /v1/load_lora_adapter`` (vLLM's shape; merged into the base, see ``inference.lora``)
and vLLM's weight-update control API (pause/resume, the four transfer phases, version
read-back, weight checker: :mod:`atroposlib.inference.control_api`). The generation side is
:mod:`atroposlib.inference.scheduler`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict
from functools import partial
from typing import Any

import torch
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from safetensors import SafetensorError
from transformers import PreTrainedModel

from atroposlib.inference.control_api import admin_router
from atroposlib.inference.control_api import router as control_router
from atroposlib.inference.engine import ModelRunner, check_compatible, load_model
from atroposlib.inference.limits import BodySizeLimit
from atroposlib.inference.lora import load_merged
from atroposlib.inference.openai_api import router as openai_router
from atroposlib.inference.scheduler import Scheduler
from atroposlib.inference.settings import InferenceSettings
from atroposlib.inference.state import ServerState, server_state
from atroposlib.inference.threads import ThreadGovernor
from atroposlib.inference.token_api import router as token_router
from atroposlib.inference.weight_paths import adapter_folder, model_folder
from atroposlib.inference.weight_transfer import TransferError
from atroposlib.security import ADMIN_DETAIL, mount_guard, require_bearer, warn_if_open
from atroposlib.security.gate import RouteKeys, mount_key_first, schema_routes
from atroposlib.web import validation_answer
from atroposlib.wire.engine import (
    InferenceHealthResponse,
    LoadLoraRequest,
    UpdateWeightsRequest,
    UpdateWeightsResponse,
)

logger = logging.getLogger(__name__)
LOAD_ERRORS = (OSError, ValueError, KeyError, RuntimeError, TypeError, SafetensorError)
"""What a checkpoint under the roots may raise while it loads: a 400 naming it, never a 500."""


def create_app(settings: InferenceSettings) -> FastAPI:
    """Build the app; the model is loaded and the worker started by the lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.threads is not None:
            torch.set_num_threads(settings.threads)
        runner = await asyncio.to_thread(
            ModelRunner,
            settings.model,
            settings.device,
            settings.dtype,
            share_prompt_prefixes=settings.share_prompt_prefixes,
            share_twin_rows=settings.share_twin_rows,
        )
        if settings.seed is not None:
            torch.manual_seed(settings.seed)  # after loading: the sampler's draws start here
        threads = None
        if settings.max_threads is not None:
            threads = ThreadGovernor(settings.threads or 1, settings.max_threads)
        scheduler = Scheduler(runner, max_batch_size=settings.max_batch_size, threads=threads)
        scheduler.start()
        app.state.inference = ServerState(
            settings, runner, scheduler, started=int(time.time()), base_path=settings.model
        )
        logger.info("serving %s as %r on %s", settings.model, settings.model_name, runner.device)
        try:
            yield
        finally:
            await asyncio.to_thread(scheduler.stop)
            app.state.inference.staging_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(
        title="atroposlib inference", lifespan=lifespan, **schema_routes(settings.expose_api_docs)
    )
    app.add_exception_handler(RequestValidationError, _invalid_request)
    chunks = {"/update_weights": (settings.max_weight_chunk_bytes, "--max-weight-chunk-bytes")}
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes, per_path=chunks)
    guarded = [Depends(require_bearer(settings.run_keys))]
    admin = [Depends(require_bearer(settings.admin_key, ADMIN_DETAIL))]
    app.include_router(openai_router, dependencies=guarded)
    app.include_router(token_router, dependencies=guarded)
    app.include_router(control_router, dependencies=guarded)
    app.include_router(admin_router, dependencies=admin)
    app.add_api_route("/health", health, methods=["GET"])
    for path, route in DISK_LOAD_ROUTES.items():
        app.add_api_route(
            path, route, methods=["POST"], dependencies=admin, response_model=UpdateWeightsResponse
        )
    # the same keys, checked again before any body is read
    admin_paths = [*(r.path for r in admin_router.routes if isinstance(r, APIRoute)),
                   *DISK_LOAD_ROUTES]  # fmt: skip
    keys = RouteKeys(settings.run_keys, settings.admin_key, ["/health"], admin_paths)
    mount_key_first(app, keys)
    mount_guard(app, settings)
    warn_if_open(settings, "the inference server")
    return app


async def _invalid_request(_: Request, error: Exception) -> Response:
    assert isinstance(error, RequestValidationError)
    return validation_answer(error)


async def health(request: Request) -> InferenceHealthResponse:
    state = server_state(request)
    return InferenceHealthResponse(
        model=state.settings.model_name,
        weight_version=state.scheduler.weight_version,
        # the counts lag one step behind; the pause mode is read live so /health agrees with
        # /is_paused as soon as /pause has answered
        **{**asdict(state.scheduler.stats), "paused": state.scheduler.paused},
    )


async def update_weights_from_disk(body: UpdateWeightsRequest, request: Request) -> Any:
    """Load a checkpoint beside the served weights, then swap it in between steps (SGLang's
    body: ``weight_version`` labels it, ``abort_all_requests`` ends what is in flight). Only a
    safetensors folder under ``--weight-roots`` is loaded (:mod:`inference.weight_paths`)."""
    state = server_state(request)
    runner = state.runner
    version = body.weight_version
    if version is not None and not version.isdigit():
        raise HTTPException(422, "weight_version: the embedded server's versions are digits")
    try:
        folder = model_folder(body.model_path, state.settings.weight_roots)
    except TransferError as error:
        return _refused(state, str(error))
    load = partial(load_model, folder, runner.device, runner.dtype, safetensors_only=True)
    answer = await _swap_in(
        state, "model_path", body.model_path, load,
        version=int(version) if version is not None else None, abort=body.abort_all_requests,
    )  # fmt: skip
    if isinstance(answer, UpdateWeightsResponse):
        state.base_path, state.lora_names = str(folder), []
    return answer


async def load_lora_adapter(body: LoadLoraRequest, request: Request) -> Any:
    """Merge a PEFT adapter into the base weights and serve it (see ``inference.lora``)."""
    state = server_state(request)
    runner = state.runner
    try:
        folder = adapter_folder(body.lora_path, state.settings.weight_roots)
    except TransferError as error:
        return _refused(state, str(error))
    load = partial(load_merged, state.base_path, folder, runner.device, runner.dtype)
    answer = await _swap_in(state, "lora_path", body.lora_path, load)
    if isinstance(answer, UpdateWeightsResponse):
        state.lora_names = [body.lora_name]
    return answer


def _refused(state: ServerState, message: str) -> JSONResponse:
    """SGLang's refusal body with our ``detail``, HTTP 400."""
    refused = UpdateWeightsResponse(
        success=False, message=message, weight_version=state.scheduler.weight_version
    )
    return JSONResponse(status_code=400, content=refused.model_dump() | {"detail": message})


async def _swap_in(
    state: ServerState,
    field: str,
    path: str,
    loader: Callable[[], PreTrainedModel],
    *,
    version: int | None = None,
    abort: bool = False,
) -> UpdateWeightsResponse | JSONResponse:
    """Load new weights off the worker thread, check them, and swap them in between steps."""
    async with state.swap_lock:
        try:
            model = await asyncio.to_thread(loader)
            check_compatible(state.runner.model, model)
        except LOAD_ERRORS as error:
            logger.warning("loading %s=%s refused: %s", field, path, error)
            return _refused(state, f"{field}: {type(error).__name__}: {error}")
        started = time.perf_counter()
        pausing = abort and state.scheduler.paused is None
        if abort:
            await state.scheduler.pause("abort")
        try:
            version = await state.scheduler.swap_weights(model, version)
        finally:
            if pausing:
                await state.scheduler.resume()
    waited = time.perf_counter() - started
    return UpdateWeightsResponse(
        success=True,
        message=f"loaded {path} (waited {waited:.2f} s for requests in flight)",
        weight_version=version,
    )


DISK_LOAD_ROUTES: dict[str, Callable[..., Any]] = {
    "/v1/load_lora_adapter": load_lora_adapter,
    "/update_weights_from_disk": update_weights_from_disk,
}
"""The admin routes that load weights from disk (SGLang's and vLLM's shapes)."""
