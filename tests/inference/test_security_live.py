"""The embedded server on a real uvicorn (a process on a free loopback port) as an attacker meets
it: no key, a wrong or an empty key, a body that never ends without the key, the schema routes,
a cross-site page, a rebinding name, another caller's weight update, a foreign shared-memory
block, a path outside the weight roots, a file in the roots linking out of them. Each is refused
with its status and nothing changes: the weight checksums (``POST /weight_checker``), version
and pause state. Then the owner's own update goes through, so the refusals are not a server
that refuses everything."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from inference_helpers import SERVED_NAME, SERVER_FLAGS, RunningServer, start_server, stop_server

from atroposlib.wire.engine import UPDATE_TOKEN_HEADER
from tests.raw_http import unfinished_post

pytestmark = pytest.mark.model
ADMIN = {"authorization": "Bearer admin-key"}
NAME, SIZE = "model.norm.weight", 576
WEIGHT_ROUTES = [
    ("/pause", None), ("/resume", None),
    ("/update_weights_from_disk", {"model_path": "/tmp"}),
    ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/tmp"}),
    ("/init_weight_transfer_engine", {"init_info": {"transport": "shm"}}),
    ("/start_weight_update", None), ("/update_weights", None),
    ("/finish_weight_update", None), ("/update_weight_version", {"new_version": "7"}),
]  # fmt: skip


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("weight-roots")


def launch(
    model: Path, env: dict[str, str], factory: pytest.TempPathFactory, *flags: str
) -> RunningServer:
    log = factory.mktemp("live") / "server.log"
    return start_server(model, env, log, *SERVER_FLAGS, *flags)


@pytest.fixture(scope="module")
def keyed(
    test_model_path: Path,
    subprocess_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
    roots: Path,
) -> Iterator[httpx.Client]:
    # the keys as launchers hand them over: the run's two variables, never a flag
    env = {k: v for k, v in subprocess_env.items() if "API_KEY" not in k}
    env |= {"ATROPOS_API_KEY": "run-key", "ATROPOS_ADMIN_API_KEY": "admin-key"}
    server = launch(test_model_path, env, tmp_path_factory, "--weight-roots", str(roots))
    with httpx.Client(base_url=server.url, timeout=120) as http:
        yield http
    stop_server(server)


def fingerprint(http: httpx.Client) -> tuple[Any, ...]:
    digests = http.post("/weight_checker", json={"action": "checksum"}, headers=ADMIN)
    assert digests.status_code == 200, digests.text
    health = http.get("/health").json()
    return digests.json()["checksums"], health["weight_version"], health["paused"]


@contextmanager
def block(name: str | None, size: int, mode: int = 0o600) -> Iterator[shared_memory.SharedMemory]:
    shm = shared_memory.SharedMemory(name=name, create=True, size=size)
    os.fchmod(shm._fd, mode)  # type: ignore[attr-defined]
    try:
        yield shm
    finally:
        shm.close()
        shm.unlink()


def update_info(shm: shared_memory.SharedMemory, declared: int | None = None) -> dict[str, Any]:
    return {"update_info": {"names": [NAME], "dtype_names": ["float32"], "shapes": [[SIZE]],
                            "shm_name": shm.name, "shm_bytes": declared or shm.size}}  # fmt: skip


def test_no_wrong_or_empty_key_changes_nothing(keyed: httpx.Client) -> None:
    before = fingerprint(keyed)
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Bearer"},
                    {"authorization": ""},
                    {"authorization": "Bearer run-key"}):  # fmt: skip
        for path, body in WEIGHT_ROUTES:
            answer = keyed.post(path, json=body, headers=headers)
            assert answer.status_code == 401, (headers, path, answer.text)
    assert fingerprint(keyed) == before


def test_the_run_key_samples_and_the_admin_key_opens_everything(keyed: httpx.Client) -> None:
    before = fingerprint(keyed)
    body = {"model": SERVED_NAME, "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    for headers in ({"authorization": "Bearer run-key"}, ADMIN):
        answer = keyed.post("/v1/completions", json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        assert keyed.get("/weight_info", headers=headers).status_code == 200
    assert fingerprint(keyed) == before


@pytest.mark.parametrize("declared", [60 * 2**20, None], ids=["60-MiB-announced", "chunked"])
def test_a_body_without_its_key_is_refused_before_it_is_read(
    keyed: httpx.Client, declared: int | None
) -> None:
    before = fingerprint(keyed)
    url = str(keyed.base_url)
    run = {"authorization": "Bearer run-key"}
    for path, wrong_keys in (("/v1/chat/completions", ({}, {"authorization": "Bearer x"})),
                             ("/generate", ({}, {"authorization": "Bearer run-key2"})),
                             ("/update_weights_from_disk", ({}, run)),
                             ("/update_weights", ({}, run))):  # fmt: skip
        for headers in wrong_keys:
            answer = unfinished_post(url, path, headers, declared=declared)
            assert answer.status == 401, (path, headers, answer.body)
            assert answer.headers["www-authenticate"] == "Bearer"
    assert fingerprint(keyed) == before


def test_the_schema_routes_are_off_by_default(keyed: httpx.Client) -> None:
    for path in ("/openapi.json", "/docs", "/redoc"):
        assert keyed.get(path).status_code == 401, path
        assert keyed.get(path, headers={"authorization": "Bearer run-key"}).status_code == 404


def test_a_file_linking_out_of_the_roots_is_refused_like_a_missing_path(
    keyed: httpx.Client, roots: Path, test_model_path: Path
) -> None:
    before = fingerprint(keyed)
    step = roots / "step-linked"
    step.mkdir()
    shutil.copy(test_model_path / "config.json", step / "config.json")
    (step / "model.safetensors").symlink_to(test_model_path / "model.safetensors")
    answer = keyed.post("/update_weights_from_disk", json={"model_path": str(step)},
                        headers=ADMIN)  # fmt: skip
    assert answer.status_code == 400, answer.text
    assert answer.json()["detail"] == (
        "model_path: no checkpoint folder of this name under the server's --weight-roots"
    )
    assert answer.json()["weight_version"] == before[1]
    assert fingerprint(keyed) == before


def test_paths_outside_the_roots_are_refused_alike(
    keyed: httpx.Client, roots: Path, test_model_path: Path
) -> None:
    before = fingerprint(keyed)
    details = set()
    for path in (test_model_path, roots / "missing", Path("/nonexistent/x"), roots / ".." / ".."):
        answer = keyed.post("/update_weights_from_disk", json={"model_path": str(path)},
                            headers=ADMIN)  # fmt: skip
        assert answer.status_code == 400, answer.text
        details.add(answer.json()["detail"])
    assert details == {
        "model_path: no checkpoint folder of this name under the server's --weight-roots"
    }
    lora = keyed.post("/v1/load_lora_adapter", headers=ADMIN,
                      json={"lora_name": "x", "lora_path": str(test_model_path)})  # fmt: skip
    assert lora.status_code == 400 and "--weight-roots" in lora.json()["detail"]
    assert fingerprint(keyed) == before


def test_another_callers_update_and_foreign_blocks_change_nothing(keyed: httpx.Client) -> None:
    before = fingerprint(keyed)
    init = keyed.post("/init_weight_transfer_engine", headers=ADMIN,
                      json={"init_info": {"transport": "shm"}})  # fmt: skip
    prefix = init.json()["shm_prefix"]
    assert prefix and len(prefix) > 16
    started = keyed.post("/start_weight_update", headers=ADMIN)
    owner = ADMIN | {UPDATE_TOKEN_HEADER: started.json()["update_token"]}
    ones = torch.ones(SIZE)

    with block(prefix + "good", SIZE * 4) as good:
        torch.frombuffer(good.buf, dtype=torch.float32, count=SIZE).copy_(ones)
        for intruder in (ADMIN, ADMIN | {UPDATE_TOKEN_HEADER: "guess"}):
            for path, body in (("/update_weights", update_info(good)),
                               ("/finish_weight_update", {"weight_version": "9"}),
                               ("/start_weight_update", None),
                               ("/init_weight_transfer_engine", {})):  # fmt: skip
                answer = keyed.post(path, json=body, headers=intruder)
                assert answer.status_code == 409, (path, answer.text)

        with block(None, SIZE * 4) as unprefixed, block(prefix + "wide", SIZE * 4, 0o644) as wide:
            for info, named in ((update_info(unprefixed), "shm_prefix"),
                                (update_info(wide), "0600"),
                                (update_info(good, SIZE * 8), "shm_bytes")):  # fmt: skip
                answer = keyed.post("/update_weights", json=info, headers=owner)
                assert answer.status_code == 400 and named in answer.text, answer.text
                assert str(SIZE * 4) not in answer.text  # the block's size is never told
        assert fingerprint(keyed) == before

        # the owner's own update, through the same routes, changes exactly that tensor
        staged = keyed.post("/update_weights", json=update_info(good), headers=owner)
        assert staged.status_code == 200, staged.text
    done = keyed.post("/finish_weight_update", json={"weight_version": "4"}, headers=owner)
    assert done.status_code == 200 and done.json()["weight_version"] == "4"
    after = fingerprint(keyed)
    assert {n for n in before[0] if before[0][n] != after[0][n]} == {NAME}


def test_without_a_key_a_browser_page_changes_nothing(
    test_model_path: Path,
    subprocess_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
    roots: Path,
) -> None:
    env = {k: v for k, v in subprocess_env.items() if "API_KEY" not in k}
    server = launch(test_model_path, env, tmp_path_factory, "--weight-roots", str(roots))
    try:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            digests = http.post("/weight_checker", json={"action": "checksum"}).json()
            for headers in ({"sec-fetch-site": "cross-site"}, {"origin": "https://evil.example"},
                            {"host": "rebind.evil.example"}):  # fmt: skip
                for path, body in WEIGHT_ROUTES:
                    answer = http.post(path, json=body, headers=headers)
                    assert answer.status_code == 403, (headers, path, answer.text)
            assert http.post("/weight_checker", json={"action": "checksum"}).json() == digests
            assert http.get("/health").json()["weight_version"] == 0
    finally:
        stop_server(server)
