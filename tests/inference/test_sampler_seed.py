"""``--seed``: the embedded server's sampler starts from a seeded generator, so two servers
started with the same seed sample the same tokens for the same request at temperature 1, and
servers with different seeds do not (atropos-local passes its ``--seed`` to the server)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from inference_helpers import SERVED_NAME, SERVER_FLAGS, start_server, stop_server

from atroposlib.localrun.components import RunLayout
from atroposlib.localrun.inference import INFERENCE
from atroposlib.localrun.settings import LocalRunSettings

REQUEST = {"model": SERVED_NAME, "prompt": "Once upon a time", "max_tokens": 24,
           "temperature": 1.0, "top_p": 1.0}  # fmt: skip


def sampled_text(model: Path, env: dict[str, str], log: Path, seed: int) -> str:
    server = start_server(model, env, log, *SERVER_FLAGS, "--seed", str(seed))
    try:
        response = httpx.post(f"{server.url}/v1/completions", json=REQUEST, timeout=120)
        response.raise_for_status()
        return str(response.json()["choices"][0]["text"])
    finally:
        stop_server(server)


@pytest.mark.slow
@pytest.mark.model
def test_the_same_seed_samples_the_same_tokens_and_another_seed_others(
    test_model_path: Path, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    first = sampled_text(test_model_path, subprocess_env, tmp_path / "a.log", seed=7)
    again = sampled_text(test_model_path, subprocess_env, tmp_path / "b.log", seed=7)
    other = sampled_text(test_model_path, subprocess_env, tmp_path / "c.log", seed=8)
    assert first == again
    assert first != other


def test_atropos_local_passes_its_seed_to_the_embedded_server(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path, "model", 1, 2, version_path="/health")
    argv = INFERENCE["embedded"].component(layout, LocalRunSettings(seed=5)).argv
    assert argv[argv.index("--seed") + 1] == "5"
