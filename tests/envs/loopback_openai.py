"""An OpenAI-compatible server for a loopback uvicorn (``tests.fakes.uvicorn_on_loopback``).

Chat completions answer text only, as hosted services do: no token ids, no logprobs. Choice
``i`` says ``"... \\boxed{i}"``. With ``tokenizer``, it also answers vLLM's ``POST /tokenize``
with that tokenizer's ids (a vLLM serving that tokenizer's model); with ``key``, every
``/v1`` request must carry ``Authorization: Bearer <key>`` (else 401, as hosted APIs answer).
``app.state.seen`` lists ``(path, Authorization header, body)`` of every request.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

UNAUTHORIZED = {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                          "code": "invalid_api_key"}}  # fmt: skip


def loopback_openai(model: str, tokenizer: Any = None, key: str | None = None) -> FastAPI:
    app = FastAPI()
    app.state.seen = []

    async def record(request: Request) -> dict[str, Any]:
        body = await request.json() if request.method == "POST" else {}
        app.state.seen.append((request.url.path, request.headers.get("authorization"), body))
        return body  # type: ignore[no-any-return]

    def refused(request: Request) -> JSONResponse | None:
        if key is not None and request.headers.get("authorization") != f"Bearer {key}":
            return JSONResponse(UNAUTHORIZED, status_code=401)
        return None

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        await record(request)
        return refused(request) or {"object": "list", "data": [{"id": model, "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await record(request)
        if (answer := refused(request)) is not None:
            return answer
        choices = [
            {"index": i, "finish_reason": "stop",
             "message": {"role": "assistant", "content": f"So the answer is \\boxed{{{i}}}."}}
            for i in range(int(body.get("n") or 1))
        ]  # fmt: skip
        usage = {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18}
        return {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": choices, "usage": usage}  # fmt: skip

    if tokenizer is not None:

        @app.post("/tokenize")
        async def tokenize(request: Request) -> Any:
            body = await record(request)
            if body.get("model") != model:
                return JSONResponse({"error": f"model {body.get('model')!r}"}, status_code=404)
            special = bool(body.get("add_special_tokens", True))
            ids = list(tokenizer.encode(body["prompt"], add_special_tokens=special))
            return {"tokens": ids, "count": len(ids), "max_model_len": 2048}

    return app
