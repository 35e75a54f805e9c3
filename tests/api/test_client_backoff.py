"""The trainer waits for a batch with a backing-off poll, not two requests a second."""

from __future__ import annotations

import itertools
import logging
import time

import httpx
import pytest

from atroposlib.client import TrainerClient
from atroposlib.utils.cli import configure_logging


def test_wait_for_batch_backs_off_between_empty_answers() -> None:
    asked: list[float] = []

    def broker(request: httpx.Request) -> httpx.Response:
        asked.append(time.monotonic())
        ready = len(asked) > 6
        return httpx.Response(200, json={"batch": [] if ready else None, "step": 1})

    client = TrainerClient(
        "http://broker", http_client=httpx.Client(transport=httpx.MockTransport(broker))
    )
    batch = client.wait_for_batch(poll_interval=0.02, max_interval=0.06)
    assert batch.step == 1 and len(asked) == 7
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    # waits 0.02, 0.03, 0.045, then the 0.06 cap: each at least as long as planned
    for gap, planned in zip(gaps, [0.02, 0.03, 0.045, 0.06, 0.06, 0.06], strict=True):
        assert gap >= planned * 0.95, gaps
    with pytest.raises(TimeoutError):
        asked.clear()
        client.wait_for_batch(poll_interval=0.02, timeout=0.0)


def test_http_clients_log_requests_only_at_debug() -> None:
    root, httpx_logger = logging.getLogger(), logging.getLogger("httpx")
    saved = root.level, httpx_logger.level
    try:
        root.setLevel(logging.INFO)
        configure_logging(logging.INFO)
        assert not httpx_logger.isEnabledFor(logging.INFO)
        root.setLevel(logging.DEBUG)
        configure_logging(logging.DEBUG)
        assert httpx_logger.isEnabledFor(logging.DEBUG)
    finally:
        root.setLevel(saved[0])
        httpx_logger.setLevel(saved[1])
