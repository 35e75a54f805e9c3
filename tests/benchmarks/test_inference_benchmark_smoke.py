"""The inference fairness benchmark's load, tiny shapes, against this checkout's server.

No timing is asserted; the figures come from ``benchmarks/inference_fairness.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from benchmarks.inference_fairness import MAX_BATCH, measure
from benchmarks.serving import start_embedded

pytestmark = [pytest.mark.slow, pytest.mark.model]


def test_small_requests_are_answered_while_a_bigger_one_runs(test_model_path: Path) -> None:
    process, url = start_embedded(test_model_path, threads=1, max_batch=MAX_BATCH)
    try:
        result = asyncio.run(measure(url, str(test_model_path), prompts=4, n=8, big_tokens=24))
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert result.loaded_s, "the big request finished before any small one was sent"
    assert result.idle_s > 0 and result.big_s > 0 and result.step_s > 0
    assert "decode steps" in result.report("embedded")
