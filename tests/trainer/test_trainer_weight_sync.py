"""Weight sync strategies against real server processes over real HTTP.

The server is tests/trainer/fake_inference_server.py (a uvicorn process serving the tiny model)
until the embedded inference server lands; it speaks the same endpoints.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from trainer_helpers import FAKE_SERVER, ListClient, base_args, fixed, make_batch

from example_trainer.checkpoint import save_weights
from example_trainer.config import load_config
from example_trainer.train import train
from example_trainer.weight_sync import DiskReload, LoraHotLoad, VllmRestart, make_weight_sync
from tests.fakes import free_port

PROMPT = [5, 17, 42, 99, 3, 250, 7, 8]


def logprobs(url: str) -> list[float]:
    body = httpx.post(url + "/v1/completions", json={"prompt": PROMPT}, timeout=30).json()
    return list(body["choices"][0]["logprobs"]["token_logprobs"])


@pytest.mark.slow
def test_disk_sync_updates_every_server_and_changes_outputs(
    fake_server: Callable[..., str], tiny_model: Path, tmp_path: Path
) -> None:
    urls = [fake_server(), fake_server()]
    before = logprobs(urls[0])
    sync = ["--weight-sync", "disk", "--inference-urls", f'["{urls[0]}", "{urls[1]}"]']
    args = base_args(tiny_model, tmp_path, "--num-steps", "3", "--lr", "1e-2", *sync)
    train(load_config(args), ListClient(fixed(make_batch(seed=7))))
    for url in urls:
        health = httpx.get(url + "/health").json()
        assert health["weight_version"] == 3
        assert health["model_path"] == str((tmp_path / "weights" / "step-3").resolve())
    after = logprobs(urls[0])
    assert max(abs(a - b) for a, b in zip(before, after, strict=True)) > 1e-3
    assert after == logprobs(urls[1])
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["step-2", "step-3"]


@pytest.mark.slow
def test_failed_pushes_are_retried_then_reported(
    fake_server: Callable[..., str], tiny_model: Path, tmp_path: Path
) -> None:
    flaky, dead = fake_server("--fail-first", "2"), f"http://127.0.0.1:{free_port()}"
    folder = tmp_path / "w"
    shutil.copytree(tiny_model, folder)
    sync = DiskReload([flaky, dead], retries=2, backoff=0.01)
    report = sync.push(folder, step=1)
    assert report.updated == [flaky] and list(report.failed) == [dead]
    assert "ConnectError" in report.failed[dead] and not report.ok
    assert httpx.get(flaky + "/health").json()["weight_version"] == 1
    refused = sync.push(tmp_path, step=2)  # not a model folder: server says success=false
    assert "success=false" in refused.failed[flaky]
    sync.close()


@pytest.mark.slow
def test_lora_adapter_is_hot_loaded(
    fake_server: Callable[..., str], tiny_model: Path, tmp_path: Path
) -> None:
    url = fake_server()
    lora = ["--lora.enabled", "--lora.r", "4", "--lora.adapter-name", "policy"]
    sync = ["--weight-sync", "lora", "--inference-urls", f'["{url}"]']
    args = base_args(tiny_model, tmp_path, "--num-steps", "2", *lora, *sync)
    train(load_config(args), ListClient(fixed(make_batch(seed=8))))
    health = httpx.get(url + "/health").json()
    adapter = Path(health["adapters"]["policy"])
    assert health["weight_version"] == 2 and adapter == (tmp_path / "weights" / "step-2").resolve()
    assert (adapter / "adapter_model.safetensors").is_file()
    assert not (adapter / "model.safetensors").exists()  # an adapter, not merged weights


@pytest.mark.slow
def test_vllm_restart_serves_the_new_checkpoint(
    tiny_model: Path, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    from transformers import AutoModelForCausalLM

    url = f"http://127.0.0.1:{free_port()}"
    command = f"{sys.executable} {FAKE_SERVER} --model {{model}} --port {{port}}"
    sync = VllmRestart([url], command, ready_timeout=120, env=subprocess_env)
    try:
        sync.start(str(tiny_model))
        first_pid = sync.procs[url].pid
        before = logprobs(url)
        model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
        for p in model.parameters():
            p.data.mul_(1.5)
        save_weights(model, tmp_path / "step-1")
        report = sync.push(tmp_path / "step-1", step=1)
        assert report.ok and report.updated == [url]
        assert sync.procs[url].pid != first_pid
        health = httpx.get(url + "/health").json()
        assert health["model_path"] == str((tmp_path / "step-1").resolve())
        assert health["weight_version"] == "1"  # labelled with its step, not "default"
        assert logprobs(url) != before
    finally:
        procs = list(sync.procs.values())
        sync.close()
    assert all(p.poll() is not None for p in procs)


def test_refusals_are_final_and_outages_are_retried(tmp_path: Path) -> None:
    calls: list[httpx.Request] = []
    answers = iter([httpx.Response(503), httpx.Response(200, json={"success": True})])

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/get_weight_version":  # the read-back after a push
            return httpx.Response(200, json={"weight_version": "4"})
        calls.append(request)
        if "bad" in request.url.host:
            return httpx.Response(400, json={"detail": "model_path: not a model folder"})
        return next(answers)

    http = httpx.Client(transport=httpx.MockTransport(handler))
    sync = DiskReload(["http://good", "http://bad"], retries=3, backoff=0.0, http_client=http)
    report = sync.push(tmp_path, step=4)
    assert report.updated == ["http://good"] and "HTTP 400" in report.failed["http://bad"]
    assert [c.url.host for c in calls] == ["good", "good", "bad"]  # 503 retried, 400 not
    body = f'{{"model_path":"{tmp_path.resolve()}","weight_version":"4"}}'
    assert calls[0].read() == body.encode()


def test_disk_reload_reports_a_server_that_kept_its_old_version(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/get_weight_version":
            return httpx.Response(200, json={"weight_version": "3"})
        return httpx.Response(200, json={"success": True})

    http = httpx.Client(transport=httpx.MockTransport(handler))
    report = DiskReload(["http://stale"], retries=0, http_client=http).push(tmp_path, step=4)
    assert report.failed == {"http://stale": "reports weight_version '3' after the update to '4'"}


def test_api_key_is_sent_as_bearer_token() -> None:
    sync = make_weight_sync("lora", ["http://h"], api_key="s3cret", adapter_name="p")
    assert isinstance(sync, LoraHotLoad)
    assert sync.client.headers["authorization"] == "Bearer s3cret"
    assert sync.body(Path("/x"), 1) == {"lora_name": "p", "lora_path": "/x", "load_inplace": True}
    sync.close()
