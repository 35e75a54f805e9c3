"""A real embedded inference server (subprocess, real model, free port), one per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from inference_helpers import SERVER_FLAGS, RunningServer, start_server, stop_server


@pytest.fixture(scope="module")
def server(
    test_model_path: Path,
    subprocess_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningServer]:
    env = subprocess_env
    log = tmp_path_factory.mktemp("inference") / "server.log"
    # the checkpoints tests write, and the served folder (reloaded to restore it)
    roots = [f"--weight-roots={tmp_path_factory.getbasetemp()},{test_model_path}"]
    running = start_server(
        test_model_path, env, log, "--max-batch-size", "8", *roots, *SERVER_FLAGS
    )
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=300) as http:
        yield http


@pytest.fixture(scope="session")
def reference(test_model_path: Path) -> tuple[object, object]:
    """The same model and tokenizer, loaded in the test process for independent checks."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(test_model_path, dtype="float32").eval()
    return model, AutoTokenizer.from_pretrained(test_model_path)
