"""A fake OpenAI-compatible inference server: ``python fake_openai.py --port N``.

Answers instantly. Choice ``i`` of a chat completion says ``"The answer is {i}"`` (followed by
``--reply-words`` times ``" word"``). ``/generate`` answers in the SGLang shape (as many ids).
``POST /control {"mode": ...}`` switches to ``fail`` (HTTP 500), ``dead_engine`` (HTTP 500 with
the body vLLM answers once its engine died; ``/health`` 503), ``hang`` (never answers),
``garbage`` (200 with a body that is not a completion), ``reject`` (404) or back to ``ok``;
``GET /control`` returns the mode, request counts and the last completion request's body.
``POST /control {"tokens_route": true}`` opens vLLM's ``/inference/v1/generate`` (closed by
default with vLLM 0.32's 403, as on a vLLM served without ``--enable-scale-out``; ``"absent"``:
404, as on a vLLM older than the route): choice ``i`` is ids
``[300 + i, 301, 2]``, its last token sampled by weight version ``late_version`` (unless set
there too, the start-up weights, which vLLM labels ``"default"``), the others by the start-up
weights.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

state: dict[str, Any] = {"mode": "ok", "requests": 0, "served": 0, "reply_words": 0,
                         "last_body": None, "tokens_route": False, "late_version": 0}  # fmt: skip
# vLLM 0.32's answer to every request once its engine core died
DEAD_ENGINE_BODY = {"error": {"message": "EngineCore encountered an issue. See stack trace (above) "
                              "for the root cause.", "type": "InternalServerError",
                              "param": None, "code": 500}}  # fmt: skip
app = FastAPI()


async def _misbehave() -> Any:
    state["requests"] += 1
    if state["mode"] == "reject":
        return JSONResponse({"detail": "model 'x' is not served here"}, status_code=404)
    if state["mode"] == "fail":
        return JSONResponse({"error": "boom"}, status_code=500)
    if state["mode"] == "dead_engine":
        return JSONResponse(DEAD_ENGINE_BODY, status_code=500)
    if state["mode"] == "hang":
        await asyncio.sleep(3600)
    if state["mode"] == "garbage":
        return PlainTextResponse("<html>definitely not json</html>")
    state["served"] += 1
    return None


def _words() -> str:
    return " word" * state["reply_words"]


@app.post("/control")
async def control(request: Request) -> dict[str, Any]:
    body = await request.json()
    state["mode"] = body.get("mode", state["mode"])
    for key in ("tokens_route", "late_version"):
        state[key] = body.get(key, state[key])
    if body.get("reset"):
        state["requests"] = state["served"] = 0
    return state


@app.get("/control")
async def read_control() -> dict[str, Any]:
    return state


@app.get("/health")
async def health() -> Any:
    return JSONResponse({}, status_code=503 if state["mode"] == "dead_engine" else 200)


@app.get("/v1/models")
async def models() -> dict[str, Any]:
    if state["mode"] in ("fail", "hang"):
        return JSONResponse({"error": "down"}, status_code=503)  # type: ignore[return-value]
    return {"object": "list", "data": [{"id": "fake", "object": "model"}]}


@app.post("/v1/chat/completions")
async def chat(request: Request) -> Any:
    body = await request.json()
    state["last_body"] = body
    if (bad := await _misbehave()) is not None:
        return bad
    choices = [
        {
            "index": i,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": f"The answer is {i}" + _words()},
        }
        for i in range(int(body.get("n") or 1))
    ]
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": body["model"],
        "choices": choices,
    }


@app.post("/v1/completions")
async def completions(request: Request) -> Any:
    body = await request.json()
    state["last_body"] = body
    if (bad := await _misbehave()) is not None:
        return bad
    choices: list[dict[str, Any]] = [
        {"index": i, "finish_reason": "stop", "text": f" The answer is {i}"}
        for i in range(int(body.get("n") or 1))
    ]
    if body.get("logprobs") is not None and isinstance(body.get("prompt"), list):
        for i, choice in enumerate(choices):  # vLLM: token ids as "token_id:N"
            ids = [300 + i, 301, 2]
            choice["logprobs"] = {
                "tokens": [f"token_id:{t}" for t in ids],
                "token_logprobs": [-0.25 * (j + 1) for j in range(len(ids))],
            }
    return {
        "id": "x",
        "object": "text_completion",
        "created": 0,
        "model": body["model"],
        "choices": choices,
    }


@app.post("/inference/v1/generate")
async def tokens_route(request: Request) -> Any:
    if state["tokens_route"] == "absent":  # a vLLM older than the route
        return JSONResponse({"detail": "Not Found"}, status_code=404)
    if not state["tokens_route"]:  # vLLM 0.32's answer without --enable-scale-out
        message = ("Scale-out endpoints are disabled. Restart vllm serve with "
                   "--enable-scale-out to enable them.")  # fmt: skip
        error = {"message": message, "type": "PermissionDeniedError", "code": 403}
        return JSONResponse({"error": error}, status_code=403)
    body = await request.json()
    state["last_body"] = body
    if (bad := await _misbehave()) is not None:
        return bad
    choices = []
    for i in range(int(body["sampling_params"].get("n", 1))):
        ids = [300 + i, 301, 2]
        # vLLM labels the weights it started with "default"
        spans = [{"version": "default", "start": 0, "end": 2},
                 {"version": str(state["late_version"]), "start": 2, "end": 3}]  # fmt: skip
        if state["late_version"] == 0:
            spans = [{"version": "default", "start": 0, "end": 3}]
        content = [{"token_id": t, "logprob": -0.25 * (j + 1)} for j, t in enumerate(ids)]
        choices.append({"index": i, "finish_reason": "stop", "token_ids": ids,
                        "logprobs": {"content": content}, "weight_versions": spans})  # fmt: skip
    return {"request_id": "x", "output_mode": "tokens", "choices": choices}


@app.post("/generate")
async def generate(request: Request) -> Any:
    body = await request.json()
    if (bad := await _misbehave()) is not None:
        return bad
    n = int(body["sampling_params"].get("n", 1))
    prompts = body["input_ids"] if isinstance(body["input_ids"][0], list) else [body["input_ids"]]
    out = []
    for prompt in prompts:
        for i in range(n):
            words = [300 + j for j in range(state["reply_words"])]
            ids = [100 + i, 200 + len(prompt) % 50, *words, 2]
            out.append(
                {
                    "text": f"gen {i}",
                    "output_ids": ids,
                    "meta_info": {
                        "output_token_logprobs": [
                            [-0.5 - 0.1 * j, t, None] for j, t in enumerate(ids)
                        ],
                        "finish_reason": {"type": "stop"},
                        "prompt_tokens": len(prompt),
                        "completion_tokens": len(ids),
                        "weight_version": 0,
                    },
                }
            )
    return out[0] if len(out) == 1 else out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--reply-words", type=int, default=0)
    args = parser.parse_args()
    state["reply_words"] = args.reply_words
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
