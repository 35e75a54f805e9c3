"""The command line (exit 2 on bad flags) and bearer-token auth (app in-process)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from atroposlib.inference import InferenceSettings, create_app


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "atroposlib.inference", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--model", "/no/such/model"], "--model"),
        (["--port", "not-a-port"], "--port"),
        (["--device", "tpu"], "--device"),
        (["--max-batch-size", "0"], "--max-batch-size"),
    ],
)
def test_bad_flags_exit_2_with_one_line(
    args: list[str], named: str, subprocess_env: dict[str, str], test_model_path: Path
) -> None:
    if "--model" not in args:
        args = ["--model", str(test_model_path), *args]
    result = run_cli(*args, env=subprocess_env)
    assert result.returncode == 2, result.stderr
    assert named in result.stderr.strip().splitlines()[-1]


def test_help_lists_every_setting(subprocess_env: dict[str, str]) -> None:
    result = run_cli("--help", env=subprocess_env)
    assert result.returncode == 0
    for flag in ("--model", "--port", "--device", "--dtype", "--max-batch-size", "--api-key"):
        assert flag in result.stdout


def test_settings_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, test_model_path: Path
) -> None:
    monkeypatch.setenv("ATROPOS_INFERENCE_MAX_BATCH_SIZE", "3")
    settings = InferenceSettings(model=str(test_model_path))
    assert settings.max_batch_size == 3
    assert settings.model_name == str(test_model_path)


@pytest.fixture
async def guarded(test_model_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = InferenceSettings(model=str(test_model_path), api_key="s3cret")
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


@pytest.mark.model
async def test_api_key_guards_everything_but_health(guarded: httpx.AsyncClient) -> None:
    assert (await guarded.get("/health")).status_code == 200
    guarded_paths = ("/v1/models", "/generate", "/tokenize", "/update_weights_from_disk",
                     "/v1/completions")  # fmt: skip
    for path in guarded_paths:
        method = guarded.get if path == "/v1/models" else guarded.post
        response = await method(path)  # type: ignore[operator]
        assert response.status_code == 401, path
        assert "Bearer" in response.json()["detail"]
    wrong = await guarded.get("/v1/models", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    right = await guarded.get("/v1/models", headers={"Authorization": "Bearer s3cret"})
    assert right.status_code == 200
    assert right.json()["data"][0]["id"].endswith("SmolLM2-135M-Instruct")


@pytest.mark.model
async def test_tokenize_answers_the_served_tokenizers_ids(
    guarded: httpx.AsyncClient, test_model_path: Path
) -> None:
    """vLLM's and SGLang's ``POST /tokenize``: what an env checks its tokenizer against."""
    from transformers import AutoTokenizer

    from atroposlib.envs.tokenizer_check import PROBE_TEXT

    tokenizer = AutoTokenizer.from_pretrained(test_model_path)
    key = {"Authorization": "Bearer s3cret"}
    for special in (False, True):
        body = {"model": str(test_model_path), "prompt": PROBE_TEXT, "add_special_tokens": special}
        answer = await guarded.post("/tokenize", json=body, headers=key)
        assert answer.status_code == 200, answer.text
        ids = tokenizer.encode(PROBE_TEXT, add_special_tokens=special)
        assert answer.json() == {"tokens": ids, "count": len(ids), "max_model_len": 8192}
    # any name: envs name the model as for /generate, which takes none (SGLang ignores it too)
    other = await guarded.post("/tokenize", json={"model": "default", "prompt": "a"}, headers=key)
    assert other.status_code == 200 and other.json()["tokens"] == tokenizer.encode("a")


def test_device_auto_is_the_gpu_when_torch_sees_one() -> None:
    import torch

    from atroposlib.inference.engine import resolve_device

    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("cuda") == "cuda"
