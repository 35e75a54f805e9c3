"""How much one request may ask of the server: body bytes, sequences, and new tokens.

Answered with 413 naming the field and the setting that raises the limit, before anything
is queued.
"""

from __future__ import annotations

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from atroposlib.inference.settings import InferenceSettings

TOO_LARGE = 413


def check_request_size(
    settings: InferenceSettings, prompt_field: str, max_new: list[int], n: int, tokens_field: str
) -> None:
    """413 if ``len(max_new)`` prompts x ``n`` sequences or their new tokens exceed limits."""
    count = len(max_new) * n
    if count > settings.max_request_sequences:
        raise HTTPException(
            TOO_LARGE,
            detail=f"{prompt_field}, n: {len(max_new)} prompt(s) x n={n} = {count} sequences "
            f"exceed this server's limit of {settings.max_request_sequences} per request "
            "(--max-request-sequences); send fewer prompts or a smaller n",
        )
    tokens = n * sum(max_new)
    if tokens > settings.max_request_tokens:
        raise HTTPException(
            TOO_LARGE,
            detail=f"{tokens_field}: {count} sequences x up to {max(max_new)} new tokens = "
            f"{tokens} tokens exceed this server's limit of {settings.max_request_tokens} per "
            f"request (--max-request-tokens); lower {tokens_field}, n or the number of prompts",
        )


class BodySizeLimit:
    """ASGI middleware: a request body over ``max_bytes`` is refused with 413; ``per_path``
    gives some paths their own (limit, flag naming it), e.g. weight chunks."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, per_path: dict[str, tuple[int, str]] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.per_path = per_path or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, flag = self.per_path.get(scope["path"], (self.max_bytes, "--max-body-bytes"))
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(scope, receive, send, limit, flag)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise HTTPException(TOO_LARGE, detail=self._detail(limit, flag))
            return message

        await self.app(scope, counted, send)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, limit: int, flag: str
    ) -> None:
        response = JSONResponse(
            status_code=TOO_LARGE, content={"detail": self._detail(limit, flag)}
        )
        await response(scope, receive, send)

    def _detail(self, limit: int, flag: str) -> str:
        fix = (
            "send smaller weight chunks (the trainer's sync_chunk_mb) or raise it"
            if flag != "--max-body-bytes"
            else "send fewer or shorter prompts per request"
        )
        return (
            f"body: the request body exceeds this server's limit of {limit} bytes ({flag}); {fix}"
        )
