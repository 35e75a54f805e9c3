"""In-flight weight pushes that fail: named, retried, never leaving a server paused, and the
run stopped with one line naming the server (a real broker and the trainer's CLI)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import torch
from test_trainer_e2e import post_batches

from example_trainer.inflight import Fleet, make_live_sync
from example_trainer.inflight.tensors import PushedWeights
from example_trainer.sync_report import SyncReport, WeightSyncError

WEIGHTS = {"w": torch.ones(2, 3), "b": torch.zeros(3)}


def pushed() -> PushedWeights:
    return PushedWeights(lambda: iter(WEIGHTS.items()), lambda: Path("/unused"))


class Servers:
    """Answers the embedded server's control routes for each host; ``version`` by host."""

    def __init__(self, version: dict[str, str], refuse: dict[str, str] | None = None) -> None:
        self.version, self.refuse = version, refuse or {}
        self.calls: list[tuple[str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        self.calls.append((host, path))
        if self.refuse.get(host) == path:
            return httpx.Response(500, json={"detail": "cannot install: out of memory"})
        if path == "/init_weight_transfer_engine":
            return httpx.Response(200, json={"dtype": "float32", "parameters": {}})
        if path == "/weight_info":
            return httpx.Response(200, json={"weight_version": self.version[host]})
        return httpx.Response(200, json={"message": "ok"})


def live(servers: Servers, retries: int = 1) -> tuple[Fleet, SyncReport]:
    urls = [f"http://{host}" for host in servers.version]
    fleet = Fleet(urls, http_client=httpx.Client(transport=httpx.MockTransport(servers)))
    sync = make_live_sync("embedded", fleet, retries=retries)
    sync.backoff = 0.0
    return fleet, sync.push_live(pushed(), step=3)


def test_every_control_call_reaches_every_server_in_vllms_order() -> None:
    servers = Servers({"a": "3", "b": "3"})
    _, report = live(servers)
    assert report.ok and report.updated == ["http://a", "http://b"] and report.retries == 0
    for host in "ab":
        paths = [path for h, path in servers.calls if h == host]
        assert paths == [
            "/init_weight_transfer_engine", "/start_weight_update", "/update_weights",
            "/pause", "/finish_weight_update", "/resume", "/weight_info",
        ]  # fmt: skip


def test_a_server_that_kept_its_old_version_is_named_after_the_retries() -> None:
    servers = Servers({"good": "3", "stale": "2"})
    _, report = live(servers, retries=1)
    assert report.failed == {"http://stale": "reports weight_version '2' after the update to '3'"}
    assert report.retries == 1
    assert [p for _, p in servers.calls].count("/resume") == 4  # two servers, two attempts
    message = str(WeightSyncError(report))
    assert message == (
        "weight sync of step 3 failed after 2 attempts: inference server http://stale reports "
        "weight_version '2' after the update to '3'"
    )


def test_a_refused_install_still_resumes_generation() -> None:
    servers = Servers({"a": "2", "b": "2"}, refuse={"b": "/finish_weight_update"})
    _, report = live(servers, retries=0)
    assert list(report.failed) == ["http://b"]
    assert "/finish_weight_update answered HTTP 500" in report.failed["http://b"]
    assert "out of memory" in report.failed["http://b"]
    assert ("a", "/resume") in servers.calls and ("b", "/resume") in servers.calls


@pytest.mark.slow
def test_the_trainer_cli_stops_with_one_line_naming_the_server(
    service: Callable[..., str],
    test_model_path: Path,
    tmp_path: Path,
    subprocess_env: dict[str, str],
) -> None:
    broker = service("atroposlib.api", "--store", "memory")
    post_batches(broker, 1)
    not_inference = broker  # answers 404 to the weight-transfer routes
    command = [
        sys.executable, "-m", "example_trainer.train", "--model", str(test_model_path),
        "--save_dir", str(tmp_path), "--broker_url", broker, "--batch_size", "8",
        "--num_steps", "2", "--max_token_len", "64", "--micro_batch_tokens", "96",
        "--weight_sync", "embedded", "--inference_urls", not_inference, "--sync_retries", "1",
    ]  # fmt: skip
    done = subprocess.run(command, env=subprocess_env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert f"weight sync of step 1 failed after 2 attempts: inference server {broker}" in last
    assert "/init_weight_transfer_engine answered HTTP 404" in last
