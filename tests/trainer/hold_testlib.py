"""Holding replies mid-generation on a frozen server, for the tests of an in-flight weight push:
one helper for the embedded server (its ``/health`` counters) and vLLM (its ``/metrics``)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import httpx

Counters = Callable[[str], tuple[float, float]]
"""``url -> (requests running, tokens each running request has sampled so far)``."""


class EndedFirst(AssertionError):
    """A request ended before all of them were held: too late for this batch of requests."""


def embedded_counters(url: str) -> tuple[float, float]:
    """The embedded server's ``/health``: one decode step samples one token per request."""
    health = httpx.get(f"{url}/health", timeout=30).json()
    return float(health["sequences_running"]), float(health["decode_steps"])


def _metric(text: str, name: str) -> float:
    values = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.MULTILINE)
    return sum(float(v) for v in values)


def vllm_counters(url: str) -> tuple[float, float]:
    """vLLM's ``/metrics``: its generated tokens, shared among the requests running now."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    running = _metric(text, "vllm:num_requests_running")
    return running, _metric(text, "vllm:generation_tokens_total") / max(running, 1.0)


def freeze(url: str) -> None:
    """Stop generation where it is (``/pause?mode=keep``); requests sent meanwhile wait."""
    httpx.post(f"{url}/pause", params={"mode": "keep"}, timeout=60).raise_for_status()


def hold_mid_generation(
    url: str,
    running: int,
    counters: Counters,
    ended: Callable[[], str | None] = lambda: None,
    tokens: int = 4,
    timeout: float = 300,
    step_s: float = 0.05,
) -> None:
    """Step a frozen server until ``running`` requests run and have each sampled ``tokens``
    more, and leave it frozen (``/pause?mode=keep``) with them mid-generation; the push's own
    pause and resume take over from there.

    Call :func:`freeze` before sending the requests. Each step resumes generation for
    ``step_s`` and freezes it again, and ``counters`` are read only while frozen, so a slow
    answer on a loaded machine cannot let the replies run to their end between two looks (it
    did once in CI, when this polled a running server: its first answer came after all six
    replies had ended).

    ``ended`` says what ended if a request already has (finished or failed): then it is too
    late to hold them all, and the error says why at once instead of waiting ``timeout``."""
    try:
        _step_until_running(url, running, counters, ended, tokens, timeout, step_s)
    except BaseException:
        httpx.post(f"{url}/resume", timeout=60)  # not frozen for the tests after this one
        raise


def _step_until_running(
    url: str,
    running: int,
    counters: Counters,
    ended: Callable[[], str | None],
    tokens: int,
    timeout: float,
    step_s: float,
) -> None:
    deadline = time.monotonic() + timeout
    first: float | None = None
    running_now = 0.0
    while time.monotonic() < deadline:
        if (what := ended()) is not None:
            raise EndedFirst(f"{running} requests could not be held mid-generation: {what}")
        running_now, sampled = counters(url)
        if running_now >= running:
            first = sampled if first is None else first
            if sampled - first >= tokens:
                return
        httpx.post(f"{url}/resume", timeout=60).raise_for_status()
        time.sleep(step_s)
        freeze(url)
    raise AssertionError(f"{running} requests never ran together (last seen: {running_now})")
