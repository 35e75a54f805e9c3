"""Fuzzing the proxy on a real uvicorn: schemathesis bodies and parameters for every route from
its OpenAPI document, once with generated session ids and the key, once with a real session's
id and token (its chat completions, render, nodes). No answer may be a 5xx."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from proxy_testlib import ScriptedEngine, proxy_app
from schemathesis.checks import not_a_server_error
from transformers import AutoTokenizer

from tests.fakes import uvicorn_on_loopback
from tests.schema_fuzz import fuzz_operations

pytestmark = pytest.mark.slow
KEY = {"authorization": "Bearer run-key"}


def test_schemathesis_finds_no_server_error(test_model_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(test_model_path))
    engine = ScriptedEngine(tokenizer, ["Ok."] * 100_000)
    app = proxy_app(tokenizer, engine, api_key="run-key", max_sessions=64,
                    max_sessions_per_client=64, idle_timeout_s=600,
                    expose_api_docs=True)  # fmt: skip
    with uvicorn_on_loopback(app) as url:
        created = httpx.post(f"{url}/sessions/create", json={}, headers=KEY).json()
        session, own = created["uuid"], {"authorization": f"Bearer {created['session_token']}"}
        generated = fuzz_operations(url, [not_a_server_error], headers=KEY, max_examples=20)
        real = fuzz_operations(url, [not_a_server_error], headers=own, schema_headers=KEY,
                               max_examples=20, skip={"DELETE /{session_id}"},
                               path_parameters={"session_id": session})  # fmt: skip
    assert generated["GET /{session_id}/nodes"] == {404}
    assert 200 in real["GET /{session_id}/nodes"]
    assert 200 in real["POST /{session_id}/v1/chat/completions/render"]
    assert engine.sampled  # some fuzzed chats were valid and sampled
