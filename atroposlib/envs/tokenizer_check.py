"""Start-up check: the env's tokenizer gives the served model's token ids.

An env tokenizes prompts (and, with ``server_type openai``, replies) itself; a tokenizer
other than the served model's trains on wrong ids without any error. vLLM, SGLang and the
embedded server answer ``POST /tokenize`` (``TokenizeRequest`` -> ``TokenizeResponse``), so
before a run starts the env asks each of them for the ids of ``PROBE_TEXT`` and refuses with
one line when they differ from its own. A server that cannot tell (a hosted API,
``server_type openai``) is skipped with an info line; one that answers 404 (an older
server) or cannot be reached is skipped with a warning.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from pydantic import ValidationError

from atroposlib.envs.server_handling.server_baseline import APIServer
from atroposlib.errors import ConfigError
from atroposlib.wire.engine import TokenizeRequest, TokenizeResponse

logger = logging.getLogger(__name__)

PROBE_TEXT = (
    "Probe 1: 12 + 345 = 357, 0.75 x 8 = 6.\n\t  two  spaces\n"
    "Ünïcödé: naïve café, 日本語, Ελληνικά, emoji 🙂.\n"
    "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<think>x</think> [INST] <s> </s>"
)
"""Digits, runs of whitespace, non-ASCII and chat markup: where tokenizers part ways."""
TOKENIZING_SERVER_TYPES = frozenset({"vllm", "sglang", "embedded"})
"""Server types that answer ``POST /tokenize``."""
SWITCH_OFF = "--env.check_tokenizer false"
PROBE_TIMEOUT_S = 30.0


async def check_tokenizer(
    servers: Sequence[object], tokenizer: Callable[[], Any], tokenizer_name: str
) -> None:
    """Raise ``ConfigError`` (one line) when a server's ids for ``PROBE_TEXT`` differ from
    ``tokenizer()``'s; ``tokenizer`` is called only when some server told its ids."""
    api_servers = [server for server in servers if isinstance(server, APIServer)]
    tells = [s.config.server_type in TOKENIZING_SERVER_TYPES for s in api_servers]
    probed = {s.root_url: s for s, can in zip(api_servers, tells, strict=True) if can}
    blind = sorted({s.base_url for s, can in zip(api_servers, tells, strict=True) if not can})
    if blind:
        logger.info(
            "tokenizer not checked against %s: these servers give no token ids (server_type "
            "openai); replies are re-tokenized with %s", ", ".join(blind), tokenizer_name
        )  # fmt: skip
    if not probed:
        return
    answers = await asyncio.gather(*(served_ids(server) for server in probed.values()))
    told = [
        (server, ids)
        for server, ids in zip(probed.values(), answers, strict=True)
        if ids is not None
    ]
    if not told:
        return
    try:
        ours = list(tokenizer().encode(PROBE_TEXT, add_special_tokens=False))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"--env.tokenizer_name {tokenizer_name!r} could not be loaded "
            f"({type(exc).__name__}: {_first_line(exc)}); set it to the served model's "
            "tokenizer (a Hugging Face name or a local folder)"
        ) from None
    for server, theirs in told:
        if theirs != ours:
            raise ConfigError(mismatch_reason(tokenizer_name, server, ours, theirs))
        logger.info("tokenizer %s gives the token ids of %r at %s", tokenizer_name,
                    server.config.model_name, server.root_url)  # fmt: skip


async def served_ids(server: APIServer) -> list[int] | None:
    """The server's ids for ``PROBE_TEXT``, or None (logged) when it cannot say."""
    url = f"{server.root_url}/tokenize"
    body = TokenizeRequest(
        model=server.config.model_name, prompt=PROBE_TEXT, add_special_tokens=False
    )
    try:
        answer = await server.http.post(
            url, json=body.model_dump(), timeout=min(PROBE_TIMEOUT_S, server.config.timeout)
        )
    except httpx.HTTPError as exc:
        logger.warning("tokenizer not checked: POST %s failed (%s)", url, exc or type(exc).__name__)
        return None
    if answer.status_code == 404:
        logger.warning(
            "tokenizer not checked: %s answered 404 (%s): an older server without /tokenize? "
            "For a hosted API use --openai.server_type openai", url, answer.text[:200]
        )  # fmt: skip
        return None
    if answer.status_code != 200:
        logger.warning("tokenizer not checked: %s answered %d (%s)", url, answer.status_code,
                       answer.text[:200])  # fmt: skip
        return None
    try:
        return TokenizeResponse.model_validate_json(answer.content).tokens
    except ValidationError:
        logger.warning("tokenizer not checked: %s gave no token list (%s)", url, answer.text[:200])
        return None


def mismatch_reason(
    tokenizer_name: str, server: APIServer, ours: list[int], theirs: list[int]
) -> str:
    """One line: which tokenizer, which served model, where they part, and the fix."""
    where = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    if where is None:
        differs = f"{len(ours)} ids here, {len(theirs)} there"
    else:
        differs = f"id {where} is {ours[where]} here, {theirs[where]} there"
    return (
        f"tokenizer mismatch: --env.tokenizer_name {tokenizer_name!r} does not give the token "
        f"ids of the model {server.config.model_name!r} served at {server.root_url} "
        f"(probe text: {differs}); set --env.tokenizer_name to the served model's tokenizer "
        f"({SWITCH_OFF} skips this check)"
    )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else type(exc).__name__
