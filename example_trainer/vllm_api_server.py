"""vLLM's engine behind Atropos's ``POST /generate`` and ``GET /health``, for its launch lines.

    python example_trainer/vllm_api_server.py --model Qwen/Qwen2.5-1.5B-Instruct --port 9001 \\
        [--host 127.0.0.1] [any vLLM engine flag: --dtype, --max-model-len, --enforce-eager ...]

Atropos's docs, SLURM scripts and trainers start this file (also as ``python -m
example_trainer.vllm_api_server``), and its ``server_type vllm`` clients post token ids to
``/generate``. Our own envs and trainer talk to stock ``vllm serve`` (``/v1/completions`` with
token ids, weights reloaded in place: ``docs/engines.md``); this server keeps those launches
working. It needs vLLM installed; nothing else in the package imports vLLM.

``POST /generate`` takes ``prompt`` (text, ``{"prompt_token_ids": [...]}`` or a list of ids) and
vLLM's ``SamplingParams`` fields beside it (``n``, ``max_tokens``, ``temperature``, ``top_p``,
``stop``, ``logprobs``, ``prompt_logprobs``, ``seed`` ...). It answers one entry per sequence:
``text``, ``token_ids``, ``finish_reasons``, with ``prompt`` and ``prompt_token_ids``; with
``logprobs`` set, ``logprobs[i][t]`` is ``[{token_id: logprob, ...}]`` with the sampled token
first (then the top alternatives); with ``prompt_logprobs`` set, ``prompt_logprobs[t]`` likewise
(``null`` for the first prompt token). Logprobs are those of the distribution sampled from,
after temperature, as the trainer computes them: ``--logprobs-mode processed_logprobs`` is the
default here (vLLM's own default is the untempered ``raw_logprobs``). A bad field answers 422
naming it; ``stream`` is not offered (422). A dead engine answers 500 with vLLM's
``EngineDeadError`` message.

It listens on loopback unless ``--host`` says otherwise, behind the guard our vLLM servers
mount (:mod:`atroposlib.vllm_plugin.guard`), which reads the keys from the environment:
``ATROPOS_API_KEY`` (the run key) opens ``/generate``, ``ATROPOS_ADMIN_API_KEY`` every route;
``/health`` stays open; without a key only loopback is served. Another ``--host`` (environments
on other nodes: ``--host 0.0.0.0``) needs ``ATROPOS_API_KEY`` (or ``ATROPOS_INSECURE_NO_KEY=1``
to serve the network open on purpose): it stops at once with a one-line reason. On vLLM's CPU
build a seeded request whose prefill is chunked kills the engine ("CPU Generator does not use
offset"), so there ``seed`` is dropped with a warning, once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from atroposlib.security.guard import is_loopback
from atroposlib.security.keys import KEY_VARIABLE
from atroposlib.vllm_plugin.guard import INSECURE_VARIABLE, VllmGuard, settings_from

logger = logging.getLogger("example_trainer.vllm_api_server")

engine: Any = None
"""The ``vllm.AsyncLLMEngine`` serving requests (set by ``main``; a test may set its own)."""
make_sampling_params: Callable[..., Any] | None = None
"""Builds the engine's sampling parameters; None: vLLM's ``SamplingParams`` (final output only)."""
drop_seed = False
"""True on an engine that a seeded chunked prefill would kill (vLLM's CPU build)."""
_seed_warned = False


class TokenPrompt(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt_token_ids: list[int] = Field(min_length=1)


class GenerateRequest(BaseModel):
    """A ``/generate`` body: the prompt, and vLLM ``SamplingParams`` fields beside it."""

    model_config = ConfigDict(extra="allow")
    prompt: str | TokenPrompt | Annotated[list[int], Field(min_length=1)]
    stream: bool = False
    n: int = Field(default=1, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    logprobs: int | None = Field(default=None, ge=0)
    prompt_logprobs: int | None = Field(default=None, ge=0)
    seed: int | None = None

    def engine_prompt(self) -> str | dict[str, list[int]]:
        if isinstance(self.prompt, TokenPrompt):
            return {"prompt_token_ids": self.prompt.prompt_token_ids}
        if isinstance(self.prompt, list):
            return {"prompt_token_ids": self.prompt}
        return self.prompt

    def sampling_fields(self) -> dict[str, Any]:
        fields = self.model_dump(exclude={"prompt", "stream"}, exclude_none=True)
        return {**fields, **(self.model_extra or {})}


def sampling_params(fields: dict[str, Any]) -> Any:
    if make_sampling_params is not None:
        return make_sampling_params(**fields)
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    return SamplingParams(**fields, output_kind=RequestOutputKind.FINAL_ONLY)


def token_logprobs(sampled: int, ranked: Mapping[int, Any] | None) -> list[dict[int, float]]:
    """One position as Atropos writes it: ``[{sampled: lp, other: lp, ...}]``, sampled first."""
    if ranked is None:
        return []
    ordered = {sampled: ranked[sampled].logprob} if sampled in ranked else {}
    ordered.update({int(t): lp.logprob for t, lp in ranked.items() if t != sampled})
    return [ordered]


def answer(final: Any, with_logprobs: bool, with_prompt_logprobs: bool) -> dict[str, Any]:
    """The ``/generate`` JSON for one finished ``RequestOutput``."""
    prompt_ids = list(final.prompt_token_ids or [])
    prompt = final.prompt if final.prompt is not None else engine.tokenizer.decode(prompt_ids)
    outputs = final.outputs
    body: dict[str, Any] = {
        "text": [out.text for out in outputs],
        "prompt": prompt,
        "finish_reasons": [out.finish_reason for out in outputs],
        "token_ids": [list(out.token_ids) for out in outputs],
        "prompt_token_ids": prompt_ids,
    }
    if with_logprobs:
        body["logprobs"] = [
            [token_logprobs(t, lp) for t, lp in zip(out.token_ids, out.logprobs, strict=True)]
            for out in outputs
        ]
    if with_prompt_logprobs:
        body["prompt_logprobs"] = [
            None if ranked is None else token_logprobs(t, ranked)
            for t, ranked in zip(prompt_ids, final.prompt_logprobs, strict=True)
        ]
    return body


def refused(exc: BaseException) -> bool:
    """An error the request caused: vLLM's ``VLLMClientError`` family (not ``ValueError``s),
    its ``GracefulHTTPError`` (with its own status), or a plain ``ValueError``."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return isinstance(exc, ValueError) or bool(names & {"VLLMClientError", "GracefulHTTPError"})


def error(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


async def unprocessable(_: Any, exc: Exception) -> JSONResponse:
    """422 whose detail names each bad field (``prompt.prompt_token_ids: ...``)."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    named = [".".join(str(p) for p in e["loc"] if p != "body") + f": {e['msg']}" for e in errors]
    return error(422, "; ".join(named) or str(exc))


app = FastAPI(
    title="vLLM /generate (Atropos's API)", docs_url=None, redoc_url=None, openapi_url=None
)
app.add_exception_handler(RequestValidationError, unprocessable)


@app.get("/health")
async def health() -> Response:
    if engine is None:
        return error(503, "engine not started yet")
    check = getattr(engine, "check_health", None)
    if check is not None:
        try:
            await check()
        except Exception as exc:  # vLLM raises its EngineDeadError here
            return error(500, f"{type(exc).__name__}: {exc}")
    return Response(status_code=200)


@app.post("/generate")
async def generate(request: GenerateRequest) -> Response:
    global _seed_warned
    if engine is None:
        return error(503, "engine not started yet")
    if request.stream:
        return error(422, "stream: not offered by this server; post without it")
    fields = request.sampling_fields()
    if drop_seed and fields.pop("seed", None) is not None and not _seed_warned:
        _seed_warned = True
        logger.warning("seed dropped: a seeded chunked prefill kills vLLM's CPU engine")
    try:
        params = sampling_params(fields)
    except TypeError as exc:  # an unknown field: "Unexpected keyword argument 'x'"
        return error(422, f"unknown sampling field ({exc})")
    except Exception as exc:
        if refused(exc):  # vLLM's own checks name the field
            return error(422, str(exc))
        raise
    final = None
    try:
        async for output in engine.generate(request.engine_prompt(), params, uuid.uuid4().hex):
            final = output
    except asyncio.CancelledError:
        return Response(status_code=499)
    except Exception as exc:
        if refused(exc):  # e.g. a prompt longer than --max-model-len
            return error(getattr(exc, "http_status", 422), str(exc))
        # EngineDeadError / EngineGenerateError: clients recognise a dead engine by its name
        logger.exception("generation failed")
        return error(500, f"{type(exc).__name__}: {exc}")
    if final is None:
        return error(500, "the engine finished without an output")
    return JSONResponse(answer(final, "logprobs" in fields, "prompt_logprobs" in fields))


DEFAULT_HOST = "127.0.0.1"


def guarded(environ: Mapping[str, str]) -> VllmGuard:
    """The app behind the guard, keyed from ``environ``, as ``main`` serves it."""
    return VllmGuard(app, environ)


def bind_refusal(argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """Why the server must not start (one line), read before vLLM is imported; None: it may."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--host", default=DEFAULT_HOST)
    host = early.parse_known_args(list(argv))[0].host
    try:
        keys = settings_from(environ)
    except ValidationError as exc:
        return "; ".join(str(error["msg"]).removeprefix("Value error, ") for error in exc.errors())
    if keys.run_keys or keys.insecure_no_key or is_loopback(host):
        return None
    return (
        f"--host {host} is reachable from other machines and {KEY_VARIABLE} is not set: export "
        f"the run's key, bind {DEFAULT_HOST}, or set {INSECURE_VARIABLE}=1 to serve it open"
    )


def main(argv: list[str] | None = None) -> None:
    """Parse vLLM's engine flags plus ``--host``/``--port``, start the engine, serve."""
    global engine, drop_seed
    arguments = sys.argv[1:] if argv is None else argv
    refusal = bind_refusal(arguments, os.environ)
    if refusal is not None:
        sys.exit(f"vllm_api_server: error: {refusal}")
    import uvicorn
    from vllm import AsyncEngineArgs, AsyncLLMEngine
    from vllm.platforms import current_platform
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default=DEFAULT_HOST, help="interface to listen on")
    parser.add_argument("--port", type=int, default=9001)
    parser = AsyncEngineArgs.add_cli_args(parser)
    parser.set_defaults(logprobs_mode="processed_logprobs")
    args = parser.parse_args(arguments)
    log_level = str(getattr(args, "log_level", "info")).lower()  # vLLM's --log-level
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    engine_args = AsyncEngineArgs.from_cli_args(args)
    engine = AsyncLLMEngine.from_engine_args(engine_args, usage_context=UsageContext.API_SERVER)
    scheduler = engine.vllm_config.scheduler_config
    drop_seed = current_platform.is_cpu() and bool(scheduler.enable_chunked_prefill)
    logger.info("serving %s on http://%s:%d (/generate, /health)", args.model, args.host, args.port)
    try:
        uvicorn.run(
            guarded(os.environ),
            host=args.host,
            port=args.port,
            log_level=log_level,
            proxy_headers=False,
        )
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
