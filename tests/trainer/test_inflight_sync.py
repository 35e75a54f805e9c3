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
        "--save-dir", str(tmp_path), "--broker-url", broker, "--batch-size", "8",
        "--num-steps", "2", "--max-token-len", "64", "--micro-batch-tokens", "96",
        "--weight-sync", "embedded", "--inference-urls", not_inference, "--sync-retries", "1",
    ]  # fmt: skip
    done = subprocess.run(command, env=subprocess_env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    # a 404 is a refusal: retrying cannot help, so the first attempt is the last
    assert f"weight sync of step 1 failed after 1 attempt: inference server {broker}" in last
    assert "/init_weight_transfer_engine answered HTTP 404" in last


class Recorder:
    """Answers any route like vLLM / SGLang would, recording (host, path, query, body)."""

    def __init__(self, answers: dict[str, dict]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str, str, dict | None]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        parsed = None if not body else httpx.Response(200, content=body).json()
        path = request.url.path
        self.calls.append((request.url.host, path, request.url.query.decode(), parsed))
        return httpx.Response(200, json=self.answers.get(path, {"success": True}))

    def of(self, host: str) -> list[tuple[str, str, dict | None]]:
        return [(p, q, b) for h, p, q, b in self.calls if h == host]


def recorded_sync(
    engine: str,
    recorder: Callable[[httpx.Request], httpx.Response],
    folder: Path = Path("/ckpt/step-7"),
    **options: object,
) -> SyncReport:
    urls = ["http://s1", "http://s2"]
    fleet = Fleet(urls, http_client=httpx.Client(transport=httpx.MockTransport(recorder)))
    sync = make_live_sync(engine, fleet, **{"retries": 0, **options})  # type: ignore[arg-type]
    sync.backoff = 0.0
    weights = PushedWeights(lambda: iter(WEIGHTS.items()), lambda: folder)
    report = sync.push_live(weights, step=7)
    sync.close()
    return report


def checkpoint(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def test_vllm_disk_backend_reloads_in_place_and_labels_the_version(tmp_path: Path) -> None:
    recorder = Recorder({"/weight_info": {"weight_version": "7"}})
    folder = checkpoint(tmp_path / "step-7")
    report = recorded_sync("vllm", recorder, folder, transport="disk", pause="wait")
    assert report.ok, report.failed
    for host in ("s1", "s2"):
        assert recorder.of(host) == [
            ("/pause", "mode=wait", None),
            ("/collective_rpc", "",
             {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}),
            ("/update_weight_version", "", {"new_version": "7"}),
            ("/reset_prefix_cache", "reset_running_requests=false", None),
            ("/resume", "", None),
            ("/weight_info", "", None),
        ]  # fmt: skip


class FakeVllmTrainerEngine:
    """Stands in for vLLM's trainer engine: drives the client the way vLLM's does."""

    def __init__(self, info: dict, client: object, source: object) -> None:
        self.info, self.client, self.source = info, client, source
        client.init_weight_transfer_engine({"rank_offset": 0, "world_size": info["world_size"]})  # type: ignore[attr-defined]

    @classmethod
    def trainer_init(cls, info: dict, client: object, source: object) -> FakeVllmTrainerEngine:
        return cls(info, client, source)

    def send_weights(self) -> None:
        names = [meta.name for meta in self.source.metadata()]  # type: ignore[attr-defined]
        self.client.start_weight_update()  # type: ignore[attr-defined]
        self.client.update_weights({"names": names})  # type: ignore[attr-defined]
        self.client.finish_weight_update()  # type: ignore[attr-defined]


def test_vllm_nccl_backend_fans_out_with_each_servers_rank_offset() -> None:
    from example_trainer.inflight.vllm import VllmEngine

    recorder = Recorder(
        {"/get_world_size": {"world_size": 2}, "/weight_info": {"weight_version": "7"}}
    )
    fleet = Fleet(
        ["http://s1", "http://s2"],
        http_client=httpx.Client(transport=httpx.MockTransport(recorder)),
    )
    engine = VllmEngine("nccl", transfer_factory=FakeVllmTrainerEngine)
    from example_trainer.inflight.driver import LiveSync

    weights = PushedWeights(lambda: iter(WEIGHTS.items()), lambda: Path("/unused"))
    report = LiveSync(engine, fleet, retries=0).push_live(weights, step=7)
    assert report.ok, report.failed
    assert engine._transfer.info["world_size"] == 5  # the trainer + 2 workers per server
    for host, offset in (("s1", 1), ("s2", 3)):
        calls = recorder.of(host)
        init = [b for p, _, b in calls if p == "/init_weight_transfer_engine"]
        assert init == [{"init_info": {"rank_offset": offset, "world_size": 5}}]
        paths = [p for p, _, _ in calls if p != "/get_world_size"]
        assert paths == [
            "/init_weight_transfer_engine", "/pause", "/start_weight_update", "/update_weights",
            "/finish_weight_update", "/reset_prefix_cache", "/resume", "/weight_info",
        ]  # fmt: skip
        finish = [b for p, _, b in calls if p == "/finish_weight_update"]
        assert finish == [{"weight_version": "7"}]
        assert [b for p, _, b in calls if p == "/update_weights"] == [
            {"update_info": {"names": ["w", "b"]}}
        ]


def test_sglang_disk_keeps_requests_in_place_and_reads_the_version_back() -> None:
    recorder = Recorder({"/get_weight_version": {"weight_version": "7"}})
    report = recorded_sync("sglang", recorder, transport="disk")
    assert report.ok, report.failed
    for host in ("s1", "s2"):
        assert recorder.of(host) == [
            ("/pause_generation", "", {"mode": "in_place"}),
            ("/update_weights_from_disk", "",
             {"model_path": "/ckpt/step-7", "weight_version": "7", "abort_all_requests": False,
              "flush_cache": False}),
            ("/continue_generation", "", {}),
            ("/get_weight_version", "", None),
        ]  # fmt: skip


def test_vllm_shm_backend_sends_the_chunks_before_the_pause_which_covers_only_the_swap() -> None:
    recorder = Recorder({"/weight_info": {"weight_version": "7"}})
    report = recorded_sync("vllm", recorder, transport="shm", pause="keep")
    assert report.ok, report.failed
    for host in ("s1", "s2"):
        calls = recorder.of(host)
        assert [path for path, _, _ in calls] == [
            "/init_weight_transfer_engine", "/start_weight_update", "/update_weights", "/pause",
            "/finish_weight_update", "/reset_prefix_cache", "/resume", "/weight_info",
        ]  # fmt: skip
        info = calls[2][2]["update_info"]  # type: ignore[index]
        prefix = calls[0][2]["init_info"]["shm_prefix"]  # type: ignore[index]
        assert prefix.startswith("atropos_") and info["shm_name"].startswith(prefix)
        assert (info["names"], info["dtype_names"], info["shapes"]) == (
            ["w", "b"],
            ["float32", "float32"],
            [[2, 3], [3]],
        )
        assert calls[3][1] == "mode=keep" and calls[4][2] == {"weight_version": "7"}


def vllm_refusing(path: str, message: str, calls: list[str]) -> Callable[..., httpx.Response]:
    """vLLM's answer when a worker raised during ``path``: HTTP 500, its RPC wording."""

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path == path:
            wrapped = (
                f"Call to collective_rpc method failed: Worker failed with error '{message}', "
                "please check the stack trace above for the root cause"
            )
            error = {"message": wrapped, "type": "InternalServerError", "code": 500}
            return httpx.Response(500, json={"error": error})
        return httpx.Response(200, json={"weight_version": "6"})

    return answer


def test_a_tensor_the_vllm_worker_refuses_is_named_once_and_not_retried() -> None:
    calls: list[str] = []
    refusal = "model.norm.weight: shape [3] does not match the served [576]"
    answer = vllm_refusing("/update_weights", refusal, calls)
    report = recorded_sync("vllm", answer, transport="shm", retries=3)
    assert report.retries == 0 and calls.count("/update_weights") == 2  # one per server
    assert report.failed["http://s1"] == f"/update_weights answered HTTP 500: refused: {refusal}"
    assert "/pause" not in calls  # refused while staging: nothing was paused


def test_a_dead_vllm_engine_is_reported_not_retried() -> None:
    calls: list[str] = []

    def dead(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        message = "EngineCore encountered an issue. See stack trace (above) for the root cause."
        return httpx.Response(500, json={"error": {"message": message, "code": 500}})

    report = recorded_sync("vllm", dead, transport="shm", retries=3)
    assert report.retries == 0 and calls.count("/init_weight_transfer_engine") == 2
    assert "EngineCore encountered an issue" in report.failed["http://s2"]


def test_a_missing_checkpoint_is_refused_before_vllm_unloads_its_weights(tmp_path: Path) -> None:
    calls: list[str] = []
    answer = vllm_refusing("/never", "", calls)
    report = recorded_sync("vllm", answer, tmp_path / "step-7", transport="disk", retries=3)
    assert report.retries == 0 and "/collective_rpc" not in calls
    assert calls.count("/resume") == 2  # the pause it was in is always lifted
    why = f"reload_weights: no checkpoint at {tmp_path / 'step-7'} (config.json missing)"
    assert report.failed == {"http://s1": why, "http://s2": why}


def test_a_connection_the_server_closed_in_the_pool_is_replaced_once() -> None:
    closed = {"s1": 1}

    def flaky(request: httpx.Request) -> httpx.Response:
        if closed.get(request.url.host, 0) > 0:
            closed[request.url.host] -= 1
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx.Response(200, json={"weight_version": "7"})

    report = recorded_sync("vllm", flaky, transport="shm")
    assert report.ok and report.retries == 0, report.failed
