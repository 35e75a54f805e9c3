"""Every choice a call asked for: a server that returns fewer than ``n`` (one that ignores
``n``) is asked again for the rest, or fails with the counts; answers merged into one."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from atroposlib.envs.server_handling.server_baseline import APIServer, GeneratedSequence
from atroposlib.errors import InferenceError

logger = logging.getLogger(__name__)
R = TypeVar("R")


SHORT_ANSWER_ASKS = 3
"""Requests one server gets for the ``n`` choices of one call before a short answer fails it."""


async def all_choices(
    ask: Callable[[int], Awaitable[R]], wanted: int, server: APIServer, count: Callable[[R], int]
) -> list[R]:
    """The answers of ``ask(n)`` until they hold ``wanted`` choices: a server that returns fewer
    than it was asked for (one that ignores ``n``) is asked again for the rest, at most
    ``SHORT_ANSWER_ASKS`` requests in all; then an InferenceError naming the server and the
    counts (the manager's retries go to another server). Extra choices are not kept."""
    answers: list[R] = []
    got = 0
    for _ in range(SHORT_ANSWER_ASKS):
        answer = await ask(wanted - got)
        answers.append(answer)
        got += count(answer)
        if got >= wanted:
            return answers if got == wanted else _trimmed(answers, wanted, count)
        logger.warning("%s returned %d of the %d choices asked for; asking for the other %d",
                       server.config.base_url, got, wanted, wanted - got)  # fmt: skip
    raise InferenceError(
        f"{server.config.base_url} returned {got} of the {wanted} choices asked for (n={wanted}) "
        f"in {SHORT_ANSWER_ASKS} requests; if it ignores n, set n_kwarg_is_ignored: true in "
        "its server config"
    )


async def generate_all(
    server: APIServer, input_ids: list[int], n: int, sampling: dict[str, Any]
) -> list[GeneratedSequence]:
    """``server.generate`` until it has given ``n`` sequences (see :func:`all_choices`)."""

    async def ask(count: int) -> list[GeneratedSequence]:
        return await server.generate(input_ids, count, sampling)

    return [sequence for part in await all_choices(ask, n, server, len) for sequence in part]


def _trimmed(answers: list[R], wanted: int, count: Callable[[R], int]) -> list[R]:
    """``answers`` with the choices past ``wanted`` dropped from the last one."""
    last = answers[-1]
    keep = wanted - sum(count(a) for a in answers[:-1])
    if isinstance(last, list):
        answers[-1] = cast(R, last[:keep])
    else:
        last.choices = last.choices[:keep]  # type: ignore[attr-defined]
    return answers


def merge_choices(responses: list[Any]) -> Any:
    """One response whose choices are those of every response, re-indexed 0..n-1."""
    merged = responses[0]
    choices = [choice for response in responses for choice in response.choices]
    for index, choice in enumerate(choices):
        choice.index = index
    merged.choices = choices
    return merged
