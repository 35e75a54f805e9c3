"""The guard vLLM mounts with ``--middleware atroposlib.vllm_plugin.guard.VllmGuard``, around a
stand-in for vLLM's app that records what reaches it: a refused request never does."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from starlette.testclient import TestClient
from starlette.types import Receive, Scope, Send

from atroposlib.vllm_plugin.guard import VllmGuard

RUN, ADMIN = {"authorization": "Bearer run-key"}, {"authorization": "Bearer admin-key"}
LOCAL = "http://127.0.0.1:8000"


class Recorder:
    """vLLM's app as the guard sees it: answers 200 and records each path it is called for."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.paths.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def guarded(environ: dict[str, str], base_url: str = LOCAL) -> tuple[TestClient, Recorder]:
    recorder = Recorder()
    return TestClient(VllmGuard(recorder, environ), base_url=base_url), recorder


ROUTES = ["/pause", "/update_weight_version", "/collective_rpc", "/v1/completions", "/weight_info"]
NOT_THE_KEY = [{}, {"authorization": "Bearer wrong"}, {"authorization": "run-key"},
               {"authorization": "Bearer "}]  # fmt: skip


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("headers", NOT_THE_KEY)
def test_no_or_wrong_key_is_401_and_reaches_nothing(path: str, headers: dict[str, str]) -> None:
    client, recorder = guarded({"ATROPOS_API_KEY": "run-key"})
    answer = client.post(path, headers=headers)
    assert answer.status_code == 401 and "Bearer" in answer.json()["detail"]
    assert answer.headers["www-authenticate"] == "Bearer"
    assert recorder.paths == []


def test_the_key_passes_and_health_style_routes_stay_open() -> None:
    client, recorder = guarded({"ATROPOS_API_KEY": "run-key"})
    assert client.post("/pause", headers=RUN).status_code == 200
    assert client.post("/v1/completions", headers=RUN).status_code == 200
    for path in ("/health", "/ping", "/metrics", "/version"):
        assert client.get(path).status_code == 200
    assert recorder.paths == ["/pause", "/v1/completions", "/health", "/ping", "/metrics",
                              "/version"]  # fmt: skip


BOTH_KEYS = {"ATROPOS_API_KEY": "run-key", "ATROPOS_ADMIN_API_KEY": "admin-key"}
ADMIN_ROUTES = [
    "/pause", "/resume", "/update_weights", "/collective_rpc", "/reload_weights",
    "/init_weight_transfer_engine", "/update_weight_version", "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter", "/tokenizer_info", "/sleep", "/wake_up", "/reset_prefix_cache",
    "/reset_mm_cache", "/start_profile", "/scale_elastic_ep", "/some_route_of_a_newer_vllm",
]  # fmt: skip


@pytest.mark.parametrize("path", ADMIN_ROUTES)
def test_the_run_key_cannot_pause_change_weights_or_load_lora(path: str) -> None:
    client, recorder = guarded(BOTH_KEYS)
    for method in ("GET", "POST"):
        refused = client.request(method, path, headers=RUN)
        assert refused.status_code == 401 and "admin" in refused.json()["detail"]
    assert recorder.paths == []  # nothing reached vLLM: nothing paused, loaded or replaced
    assert client.post(path, headers=ADMIN).status_code == 200
    assert recorder.paths == [path]


def test_the_run_key_samples_and_reads_and_the_admin_key_opens_everything() -> None:
    client, recorder = guarded(BOTH_KEYS)
    sampling = ["/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize",
                "/detokenize", "/inference/v1/generate", "/weight_info", "/is_paused"]  # fmt: skip
    for path in sampling:
        assert client.post(path, headers=RUN).status_code == 200, path
        assert client.post(path, headers=ADMIN).status_code == 200, path
    assert recorder.paths == [path for path in sampling for _ in range(2)]


@pytest.mark.parametrize("path", ["/v1/completions", "/pause", "/v1/load_lora_adapter"])
@pytest.mark.parametrize("headers", [*NOT_THE_KEY, RUN])
def test_an_admin_key_alone_leaves_nothing_open(path: str, headers: dict[str, str]) -> None:
    client, recorder = guarded({"ATROPOS_ADMIN_API_KEY": "admin-key"})
    assert client.post(path, headers=headers).status_code == 401
    network, network_app = guarded({"ATROPOS_ADMIN_API_KEY": "admin-key"}, "http://10.0.0.7:8000")
    assert network.post(path, headers=headers).status_code == 401
    assert recorder.paths == [] and network_app.paths == []
    assert client.post(path, headers=ADMIN).status_code == 200
    assert network.post(path, headers=ADMIN).status_code == 200


@pytest.mark.parametrize("variable", ["ATROPOS_API_KEY", "ATROPOS_ADMIN_API_KEY"])
@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_key_is_an_error_at_construction(variable: str, empty: str) -> None:
    with pytest.raises(ValidationError, match="set but empty"):
        VllmGuard(Recorder(), {"ATROPOS_API_KEY": "run-key", variable: empty})


@pytest.mark.parametrize(
    "headers",
    [{"sec-fetch-site": "cross-site"}, {"origin": "https://evil.example.com"},
     {"host": "evil.example.com"}, {"host": "evil.example.com:8000"}],
)  # fmt: skip
def test_without_a_key_browsers_on_other_sites_and_rebinding_names_are_refused(
    headers: dict[str, str],
) -> None:
    client, recorder = guarded({})
    answer = client.post("/pause", headers=headers)
    assert answer.status_code == 403 and recorder.paths == []


def test_without_a_key_only_loopback_is_served_unless_open_on_purpose() -> None:
    client, recorder = guarded({})
    assert client.post("/pause").status_code == 200  # a tool on this machine
    network, _ = guarded({}, base_url="http://10.0.0.7:8000")
    refused = network.post("/update_weights")
    assert refused.status_code == 403 and "ATROPOS_API_KEY" in refused.json()["detail"]
    assert network.get("/health").status_code == 200
    opened, opened_app = guarded({"ATROPOS_INSECURE_NO_KEY": "1"}, base_url="http://10.0.0.7:8000")
    assert opened.post("/update_weights").status_code == 200
    assert recorder.paths == ["/pause"] and opened_app.paths == ["/update_weights"]


def test_allowed_hosts_extend_the_names_a_keyless_vllm_answers() -> None:
    client, recorder = guarded({"ATROPOS_ALLOWED_HOSTS": "inference.lab, other.lab"})
    assert client.post("/pause", headers={"host": "inference.lab:8000"}).status_code == 200
    assert client.post("/pause", headers={"host": "evil.example.com"}).status_code == 403
    assert recorder.paths == ["/pause"]


def test_a_keyed_vllm_refuses_a_websocket_without_the_key() -> None:
    from starlette.websockets import WebSocketDisconnect

    client, recorder = guarded({"ATROPOS_API_KEY": "run-key"})
    with pytest.raises(WebSocketDisconnect) as closed, client.websocket_connect("/v1/realtime"):
        pass
    assert closed.value.code == 1008 and recorder.paths == []
