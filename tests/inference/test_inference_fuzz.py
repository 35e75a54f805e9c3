"""Fuzzing the embedded server on a real uvicorn: schemathesis bodies and parameters for every
route from its OpenAPI document, with the run key (the admin routes then answer 401) and with
the admin key (the weight routes, ``/pause`` left out: a paused server would hold the next
generation until a fuzzed ``/resume``). No answer may be a 5xx."""

from __future__ import annotations

from pathlib import Path

import pytest
from inference_helpers import SERVER_FLAGS, start_server, stop_server
from schemathesis.checks import not_a_server_error

from tests.schema_fuzz import fuzz_operations

pytestmark = [pytest.mark.slow, pytest.mark.model]


def test_schemathesis_finds_no_server_error(
    test_model_path: Path, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    env = {k: v for k, v in subprocess_env.items() if "API_KEY" not in k}
    flags = ("--api-key", "run-key", "--admin-api-key", "admin-key", "--weight-roots",
             str(tmp_path), "--max-request-tokens", "64", "--expose-api-docs")  # fmt: skip
    server = start_server(test_model_path, env, tmp_path / "server.log", *SERVER_FLAGS, *flags)
    try:
        run_key = {"authorization": "Bearer run-key"}
        run = fuzz_operations(server.url, [not_a_server_error], max_examples=15,
                              headers=run_key)  # fmt: skip
        admin = fuzz_operations(server.url, [not_a_server_error], max_examples=15,
                                headers={"authorization": "Bearer admin-key"},
                                schema_headers=run_key, skip={"POST /pause"})  # fmt: skip
    finally:
        stop_server(server)
    # the keys reached the routes: the run key is answered on its routes, refused on the admin
    # ones; the admin key gets past the key check on the weight routes
    assert 200 in run["GET /v1/models"]
    for label in ("POST /v1/completions", "POST /v1/chat/completions", "POST /generate"):
        assert run[label] and 401 not in run[label], (label, run[label])
    assert run["POST /update_weights_from_disk"] == run["POST /weight_checker"] == {401}
    assert 200 in admin["POST /weight_checker"]
    assert 400 in admin["POST /update_weights_from_disk"]
    assert "POST /pause" not in admin
