"""Fuzzing a real broker: schemathesis from its OpenAPI document, and our own mutator.

schemathesis generates bodies and parameters of every route from the schema (JSON and msgpack
bodies, the fast routes included) and checks that no answer is a 5xx and that every answer is
documented and matches its schema. The mutator (``benchmarks/fuzz_broker.py``, which runs
100,000 requests) sends a few thousand hostile requests with and without an API key, then the
brokers are killed and must reopen their stores. Both run at a size that fits CI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest
import schemathesis
from broker_testlib import BrokerProcess
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from benchmarks.fuzz_broker import run
from tests.schema_fuzz import fuzz_operations

pytestmark = pytest.mark.slow


@schemathesis.serializer("application/msgpack")
def _msgpack(_: Any, value: Any) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True)
    except OverflowError:  # an integer past 64 bits: msgpack has none, send the JSON text
        return json.dumps(value).encode()


def test_schemathesis_finds_no_server_error_and_no_undocumented_answer(tmp_path: Path) -> None:
    broker = BrokerProcess(f"sqlite:{tmp_path / 'broker.sqlite3'}", "--expose-api-docs").start()
    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]
    try:
        tested = fuzz_operations(broker.url, checks)
    finally:
        broker.stop()
    assert len(tested) == 17, tested


def test_mutated_requests_get_no_5xx_and_the_stores_reopen(tmp_path: Path) -> None:
    report, reopened = run(3000, seed=1, folder=tmp_path)
    assert report.errors_500 == 0, report.server_errors[:3]
    assert reopened
    assert report.requests >= 2900
    seen = set(report.statuses)
    assert {200, 400, 401, 403, 404, 422} <= seen, report.statuses  # every kind of answer
