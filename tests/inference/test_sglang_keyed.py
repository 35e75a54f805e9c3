"""``atroposlib.cli.sglang_keyed`` around a stand-in for SGLang (SGLang needs a GPU).

The stand-in ``sglang`` package written here copies the two SGLang code paths that leak a
key given to SGLang, in our own words: its engine logs ``server_args=ServerArgs(...)`` (the
dataclass repr, every field) when it starts, ``GET /get_server_info`` answers
``dataclasses.asdict(server_args)``, and its warm-up request is sent with ``server_args.api_key``
(the process exits when it fails). The launch goes through the real ``python -m
atroposlib.cli.sglang_keyed`` and a real uvicorn; the keys must appear in neither the log nor
the info route, and a run-key holder must not change the served weights."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.fakes import free_port

RUN_KEY, ADMIN_KEY = "run-key-5c1f0e", "admin-key-93d2aa"
RUN, ADMIN = {"authorization": f"Bearer {RUN_KEY}"}, {"authorization": f"Bearer {ADMIN_KEY}"}
REPO = Path(__file__).resolve().parents[2]

HTTP_SERVER = """
import dataclasses, logging, sys, threading, urllib.request
import uvicorn
from fastapi import FastAPI, Request

logger = logging.getLogger("sglang.srt.engine")
app = FastAPI()
state = {"server_args": None, "weight_version": "default"}  # SGLang's start-up label

@app.get("/health")
async def health():
    return {}

@app.post("/generate")
async def generate(request: Request):
    body = await request.json() if await request.body() else {}
    prompt = body.get("input_ids") or [0]
    n = (body.get("sampling_params") or {}).get("n", 1)
    # SGLang's answer: one version for the whole request, read when it ends
    entries = [{"output_ids": [7 + i, 8, 2], "meta_info": {
        "output_token_logprobs": [[-0.5, 7 + i, None], [-0.25, 8, None], [-0.125, 2, None]],
        "finish_reason": {"type": "stop"}, "prompt_tokens": len(prompt),
        "weight_version": state["weight_version"]}} for i in range(n)]
    return entries if n > 1 else entries[0]

@app.get("/get_weight_version")
async def get_weight_version():
    return {"weight_version": state["weight_version"]}

@app.post("/update_weights_from_disk")
async def update_weights_from_disk(request: Request):
    state["weight_version"] = (await request.json())["weight_version"]
    return {"success": True}

@app.get("/get_server_info")
async def get_server_info():
    return dataclasses.asdict(state["server_args"])

def warm_up(server_args):
    request = urllib.request.Request(
        f"http://{server_args.host}:{server_args.port}/generate", data=b"{}", method="POST")
    if server_args.api_key:
        request.add_header("Authorization", f"Bearer {server_args.api_key}")
    try:
        urllib.request.urlopen(request, timeout=30)
    except Exception as error:
        logger.error("warmup failed: %s", error)
        sys.exit(1)

def launch_server(server_args):
    logging.basicConfig(level=logging.INFO)
    logger.info(f"{server_args=}")
    state["server_args"] = server_args
    if not server_args.skip_server_warmup:
        threading.Timer(2.0, warm_up, [server_args]).start()
    uvicorn.run(app, host=server_args.host, port=server_args.port, log_level="info")
"""

LAUNCH_SERVER = """
import argparse, dataclasses
from sglang.srt.entrypoints.http_server import launch_server

@dataclasses.dataclass
class ServerArgs:
    model_path: str
    host: str
    port: int
    served_model_name: str | None
    api_key: str | None
    admin_api_key: str | None
    skip_server_warmup: bool

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("--model-path", "--host", "--served-model-name", "--api-key", "--admin-api-key"):
        parser.add_argument(name)
    parser.add_argument("--port", type=int)
    parser.add_argument("--skip-server-warmup", action="store_true")
    launch_server(ServerArgs(**vars(parser.parse_args())))
"""


def fake_sglang(root: Path) -> Path:
    for module, text in (("sglang/launch_server.py", LAUNCH_SERVER),
                         ("sglang/srt/entrypoints/http_server.py", HTTP_SERVER)):  # fmt: skip
        path = root / module
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    for package in ("sglang", "sglang/srt", "sglang/srt/entrypoints"):
        (root / package / "__init__.py").write_text("")
    return root


@dataclass
class Launched:
    url: str
    log_path: Path
    process: subprocess.Popen[bytes]


@contextmanager
def keyed_sglang(tmp_path: Path, subprocess_env: dict[str, str]) -> Iterator[Launched]:
    """The stand-in launched through ``python -m atroposlib.cli.sglang_keyed`` with the run's
    keys, answering; stopped at the end."""
    port, log_path = free_port(), tmp_path / "sglang.log"
    env = {k: v for k, v in subprocess_env.items() if "API_KEY" not in k}
    env |= {"PYTHONPATH": f"{fake_sglang(tmp_path / 'fake')}:{REPO}",
            "ATROPOS_API_KEY": RUN_KEY, "ATROPOS_ADMIN_API_KEY": ADMIN_KEY}  # fmt: skip
    command = [
        sys.executable,
        "-m",
        "atroposlib.cli.sglang_keyed",
        "--model-path",
        "m",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        "default",
    ]
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(1200):  # up to 2 minutes for a stand-in that starts in about one second
            if _answers(f"{url}/health"):
                break
            assert process.poll() is None, log_path.read_text()
            time.sleep(0.1)
        yield Launched(url, log_path, process)
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_keys_reach_neither_sglangs_log_nor_its_info_route_and_the_run_key_changes_nothing(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    with keyed_sglang(tmp_path, subprocess_env) as sglang:
        url = sglang.url
        assert httpx.post(f"{url}/generate", json={}, headers=RUN).status_code == 200
        admin_routes = [("POST", "/update_weights_from_disk", {"weight_version": "9"}),
                        ("GET", "/get_server_info", None)]  # fmt: skip
        for headers in ({}, {"authorization": "Bearer wrong"}, RUN):
            for method, path, body in admin_routes:
                answer = httpx.request(method, url + path, json=body, headers=headers)
                assert answer.status_code == 401, (headers, path)
        version = httpx.get(f"{url}/get_weight_version", headers=RUN).json()
        assert version == {"weight_version": "default"}  # nothing changed
        info = httpx.get(f"{url}/get_server_info", headers=ADMIN)
        assert info.status_code == 200 and info.json()["api_key"] is None
        assert info.json()["skip_server_warmup"] is True  # SGLang's keyless warm-up is skipped
    logged = sglang.log_path.read_text()
    assert "server_args=ServerArgs(" in logged and "api_key=None" in logged
    for key in (RUN_KEY, ADMIN_KEY):
        assert key not in logged and key not in info.text


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


async def test_an_env_on_sglang_gets_the_version_of_the_weights_each_reply_ended_on(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """SGLang reports one weight version per request (``meta_info.weight_version``, read as
    the request ends), no per-token spans: every token of a reply carries it, ``"default"``
    (its start-up weights) read as step 0 (docs/engines.md)."""
    from atroposlib.envs.server_handling.server_baseline import APIServerConfig
    from atroposlib.envs.server_handling.sglang_server import SGLangServer

    with keyed_sglang(tmp_path, subprocess_env) as sglang:
        config = APIServerConfig(base_url=f"{sglang.url}/v1", server_type="sglang",
                                 model_name="default", api_key=RUN_KEY)  # fmt: skip
        server = SGLangServer(config)
        try:
            before = await server.generate([1, 2, 3], 2, {"max_tokens": 3})
            push = {"model_path": "m", "weight_version": "3"}
            answer = httpx.post(f"{sglang.url}/update_weights_from_disk", json=push, headers=ADMIN)
            assert answer.status_code == 200
            after = await server.generate([1, 2, 3], 1, {"max_tokens": 3})
        finally:
            await server.close()
    assert [s.output_ids for s in before] == [[7, 8, 2], [8, 8, 2]]
    assert [s.logprobs for s in before] == [[-0.5, -0.25, -0.125]] * 2
    assert [s.weight_version for s in before] == [0, 0]
    assert [(s.weight_version, s.token_versions) for s in after] == [(3, None)]
