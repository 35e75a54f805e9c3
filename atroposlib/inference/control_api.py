"""The weight-update control API: vLLM's RL routes (and SGLang's version read-back name).

``POST /pause?mode=abort|wait|keep``, ``POST /resume``, ``GET /is_paused``,
``POST /init_weight_transfer_engine``, ``POST /start_weight_update``, ``POST /update_weights``
(one chunk; see :mod:`atroposlib.inference.weight_transfer`), ``POST /finish_weight_update``,
``POST /update_weight_version``, ``GET /weight_info`` (also ``GET /get_weight_version``),
``POST /weight_checker`` and ``POST /reset_prefix_cache``. A trainer drives them in vLLM's
order; here the chunks are staged beside the served weights, so they may also arrive before
the pause, which then only has to cover the install.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import ValidationError

from atroposlib.inference.requests import bad_request
from atroposlib.inference.state import ServerState, server_state
from atroposlib.inference.weight_transfer import (
    BlockClaim,
    Staging,
    TransferError,
    checksums,
    dtype_name,
    expected_parameters,
    read_safetensors,
    stage_shared_memory,
)
from atroposlib.wire.engine import UPDATE_TOKEN_HEADER as UPDATE_TOKEN
from atroposlib.wire.engine import (
    FinishWeightUpdateRequest,
    GenerationStateResponse,
    IsPausedResponse,
    PauseMode,
    ResetPrefixCacheResponse,
    UpdateWeightVersionRequest,
    WeightCheckerRequest,
    WeightCheckerResponse,
    WeightInfoResponse,
    WeightTransferInitRequest,
    WeightTransferInitResponse,
    WeightTransferResponse,
    WeightUpdateRequest,
)

logger = logging.getLogger(__name__)
router = APIRouter()
"""Routes that only read (is_paused, weight_info): the run's key."""
admin_router = APIRouter()
"""Routes that pause generation or change the weights: the admin key (else the run's key)."""


@admin_router.post("/pause", response_model=GenerationStateResponse)
async def pause(
    request: Request,
    mode: Annotated[PauseMode, Query(description="abort, wait or keep (vLLM's modes).")] = "abort",
    clear_cache: Annotated[bool, Query(description="Accepted for vLLM; no cache to clear.")] = True,
) -> GenerationStateResponse:
    await server_state(request).scheduler.pause(mode)
    return GenerationStateResponse(status="paused")


@admin_router.post("/resume", response_model=GenerationStateResponse)
async def resume(request: Request) -> GenerationStateResponse:
    await server_state(request).scheduler.resume()
    return GenerationStateResponse(status="resumed")


@router.get("/is_paused", response_model=IsPausedResponse)
async def is_paused(request: Request) -> IsPausedResponse:
    return IsPausedResponse(is_paused=server_state(request).scheduler.paused is not None)


@admin_router.post("/init_weight_transfer_engine", response_model=WeightTransferInitResponse)
async def init_weight_transfer_engine(
    body: WeightTransferInitRequest, request: Request
) -> WeightTransferInitResponse:
    state = server_state(request)
    _claim_free(state, request, "init_weight_transfer_engine")
    if state.staging is not None:  # its owner connects again, or it lay idle too long
        logger.warning(
            "dropping an unfinished weight update (%d tensors)", len(state.staging.tensors)
        )
        state.staging = None
    state.transport = body.init_info.transport
    served = dict(state.runner.model.named_parameters())
    return WeightTransferInitResponse(
        message=f"Weight transfer initialized ({state.transport})",
        parameters={name: list(p.shape) for name, p in served.items()},
        dtype=dtype_name(state.runner.dtype),
        shm_prefix=state.shm_prefix if state.transport == "shm" else None,
    )


@admin_router.post("/start_weight_update", response_model=WeightTransferResponse)
async def start_weight_update(request: Request) -> WeightTransferResponse:
    """Start an update owned by the caller: the token it answers is needed by every later
    call of this update; another caller gets 409 until it finishes or lies idle too long."""
    state = server_state(request)
    if state.transport is None:
        raise bad_request("transport", "call /init_weight_transfer_engine first", 409)
    _claim_free(state, request, "start_weight_update")
    state.staging = Staging(expected_parameters(state.runner.parameters()))
    return WeightTransferResponse(message="Weight update started", update_token=state.staging.token)


@admin_router.post("/update_weights", response_model=WeightTransferResponse)
async def update_weights(request: Request) -> WeightTransferResponse:
    """One chunk: a safetensors body (``http``) or JSON naming a shared-memory block."""
    state = server_state(request)
    staging = _owned(state, request)
    limit = state.settings.max_concurrent_weight_uploads
    if state.uploads >= limit:
        raise bad_request(
            "max_concurrent_weight_uploads",
            f"{limit} chunks are being staged already; send the next when one has answered",
            429,
        )
    state.uploads += 1
    try:
        stage = _stager(state, staging, request.headers, await request.body())
        loop = asyncio.get_running_loop()
        staged = await loop.run_in_executor(state.staging_pool, stage)
    except TransferError as error:
        raise bad_request(error.field, str(error).split(": ", 1)[1]) from error
    finally:
        state.uploads -= 1
    return WeightTransferResponse(message="Weights staged", tensors=staged)


def _stager(
    state: ServerState, staging: Staging, headers: Mapping[str, str], body: bytes
) -> Callable[[], int]:
    """The call that stages this chunk, as its content type says; TransferError if none can."""
    media = headers.get("content-type", "").split(";")[0].strip()
    if media == "application/json":
        if state.transport != "shm":
            raise TransferError("content-type", "the http transport sends safetensors bodies")
        try:
            info = WeightUpdateRequest.model_validate_json(body).update_info
        except ValidationError as error:
            where = ".".join(str(p) for p in error.errors()[0]["loc"])
            raise TransferError(where or "body", error.errors()[0]["msg"]) from error
        claim = BlockClaim(state.shm_prefix, info.shm_bytes)
        return partial(
            stage_shared_memory,
            staging, info.shm_name, info.names, info.dtype_names, info.shapes, claim,
        )  # fmt: skip
    if media == "application/octet-stream":
        if state.transport != "http":
            raise TransferError("content-type", "the shm transport sends JSON update_info")
        return partial(_stage_safetensors, staging, body)
    raise TransferError("content-type", "send application/octet-stream or application/json")


@admin_router.post("/finish_weight_update", response_model=WeightTransferResponse)
async def finish_weight_update(
    request: Request, body: FinishWeightUpdateRequest | None = None
) -> WeightTransferResponse:
    """Install the staged tensors between two decode steps, then report the new version."""
    state = server_state(request)
    staging = _owned(state, request)
    version = _version(body.weight_version if body is not None else None)
    state.staging = None
    try:
        installed = await state.scheduler.install_weights(staging.tensors, version)
    except (KeyError, ValueError, RuntimeError) as error:
        raise bad_request("update_weights", str(error)) from error
    count = len(staging.tensors)
    logger.info(
        "installed %d tensors from %d chunks as version %d", count, staging.chunks, installed
    )
    return WeightTransferResponse(
        message=f"Weight update finished: {count} tensors",
        weight_version=str(installed),
        tensors=count,
    )


@admin_router.post("/update_weight_version", response_model=WeightTransferResponse)
async def update_weight_version(
    body: UpdateWeightVersionRequest, request: Request
) -> WeightTransferResponse:
    """vLLM's route: label the served weights without changing them."""
    version = _version(body.new_version, "new_version")
    installed = await server_state(request).scheduler.install_weights({}, version)
    return WeightTransferResponse(message="Weight version updated", weight_version=str(installed))


@router.get("/weight_info", response_model=WeightInfoResponse)
@router.get("/get_weight_version", response_model=WeightInfoResponse)
async def weight_info(request: Request) -> WeightInfoResponse:
    return WeightInfoResponse(weight_version=str(server_state(request).scheduler.weight_version))


@admin_router.post(
    "/weight_checker", response_model=WeightCheckerResponse, response_model_exclude_none=True
)
async def weight_checker(body: WeightCheckerRequest, request: Request) -> WeightCheckerResponse:
    state = server_state(request)
    served = dict(state.runner.model.named_parameters())
    digests = await asyncio.to_thread(checksums, served)
    if body.action == "checksum":
        return WeightCheckerResponse(checksums=digests)
    if body.baseline is None:
        raise bad_request("baseline", "action 'compare' needs a baseline of checksums", 422)
    names = digests.keys() | body.baseline.keys()
    mismatches = sorted(n for n in names if digests.get(n) != body.baseline.get(n))
    return WeightCheckerResponse(match=not mismatches, mismatches=mismatches)


@admin_router.post("/reset_prefix_cache", response_model=ResetPrefixCacheResponse)
async def reset_prefix_cache(
    request: Request,
    reset_running_requests: Annotated[
        bool, Query(description="Also make running requests recompute their KV cache.")
    ] = False,
) -> ResetPrefixCacheResponse:
    """There is no prefix cache to reset; running rows can be made to recompute theirs."""
    if reset_running_requests:
        await server_state(request).scheduler.recompute_running()
    return ResetPrefixCacheResponse(success=True)


def _stage_safetensors(staging: Staging, body: bytes) -> int:
    return staging.add(read_safetensors(body))


def _owned(state: ServerState, request: Request) -> Staging:
    """The active update, when the caller sent its token (409 otherwise)."""
    if state.staging is None:
        raise bad_request("start_weight_update", "no weight update is active; start one first", 409)
    if not _holds(state.staging, request):
        raise bad_request(
            UPDATE_TOKEN,
            "the active weight update belongs to another caller; send the update_token "
            "your /start_weight_update answered",
            409,
        )
    state.staging.touched = time.monotonic()
    return state.staging


def _claim_free(state: ServerState, request: Request, route: str) -> None:
    """409 while another caller's update is active and has not lain idle for
    ``weight_update_idle_s``; its owner (the token) may start over at any time."""
    staging = state.staging
    if staging is None or _holds(staging, request):
        return
    idle_s = state.settings.weight_update_idle_s
    if time.monotonic() - staging.touched < idle_s:
        raise bad_request(
            route,
            "called while a weight update is already active; call /finish_weight_update "
            f"first (another caller's update is given up after {idle_s:g} s idle: "
            "--weight-update-idle-s)",
            409,
        )


def _holds(staging: Staging, request: Request) -> bool:
    given = request.headers.get(UPDATE_TOKEN, "")
    return hmac.compare_digest(given.encode(), staging.token.encode())


def _version(value: str | None, field: str = "weight_version") -> int | None:
    if value is None:
        return None
    if not value.isdigit() or len(value) > 12:
        raise bad_request(field, "the embedded server's versions are trainer steps (digits)", 422)
    return int(value)
